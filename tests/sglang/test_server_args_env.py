"""Env hook names against SGLang's registry (preflight), and rendered commands read back to argv.

No wheel needed: these use the committed registry file (test_server_args.py regenerates it from
the wheel) and hand-written conf files. The preflight case runs the real playbook.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from sglang_testlib import SGLANG_VERSION

from pd_appliance.sglang_args import rendered
from pd_appliance.sglang_args.registry import EnvRegistry, RegistryError, env_name_errors, variant_sources
from pd_testlib import ROOT, run_playbook

REGISTRY_FILE = ROOT / f"files/sglang/{SGLANG_VERSION}/environ-names.json"


@pytest.fixture(scope="module")
def registry() -> EnvRegistry:
    return EnvRegistry.load(REGISTRY_FILE)


def test_names_the_appliance_sets_are_known(registry: EnvRegistry) -> None:
    for name in (
        "SGLANG_DISAGGREGATION_NIXL_BACKEND",
        "SGLANG_SM120_FLASHMLA_BACKEND",
        "SGLANG_TORCH_PROFILER_DIR",
        "SGLANG_OPT_USE_TILELANG_INDEXER",
        "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH",
        "SGLANG_HOST_IP",
    ):  # fmt: skip  (the last one SGLang reads from os.environ directly)
        assert registry.problem(name) is None, name
    assert registry.problem("NCCL_DEBUG") is None and registry.problem("UCX_TLS") is None


def test_a_misspelt_name_fails_naming_variable_and_the_closest_name(registry: EnvRegistry) -> None:
    errors = env_name_errors("gpu-01", {"serving_env_decode": ["SGLANG_SM120_FLASHMLA_BACKNED"]}, registry)
    assert errors == [
        f"gpu-01: serving_env_decode sets SGLANG_SM120_FLASHMLA_BACKNED: SGLang {SGLANG_VERSION} does not "
        f"read it (not in {REGISTRY_FILE}). Fix the name in serving_env_decode: "
        "did you mean SGLANG_SM120_FLASHMLA_BACKEND?"
    ]


def test_deprecated_legacy_and_unknown_names(registry: EnvRegistry) -> None:
    deprecated = registry.problem("SGLANG_EPLB_ROCM_P2P_BATCH_CHUNK_SIZE")
    assert deprecated and "use SGLANG_EPLB_P2P_BATCH_CHUNK_SIZE" in deprecated[0]
    legacy = registry.problem("SGL_DISAGGREGATION_NIXL_BACKEND")
    assert legacy and legacy[1] == "write SGLANG_DISAGGREGATION_NIXL_BACKEND"
    unknown = registry.problem("SGLANG_NOTHING_LIKE_THIS_AT_ALL")
    assert unknown and "environ.py" in unknown[1]


def test_registry_counts_patch_series_names_and_refuses_other_files(tmp_path: Path) -> None:
    data = {"format": 1, "sglang_version": "9", "names": ["SGLANG_A"], "patch_series": ["SGLANG_OURS"]}
    registry = EnvRegistry.from_dict(data)
    assert registry.problem("SGLANG_OURS") is None and registry.problem("SGLANG_B") is not None
    with pytest.raises(RegistryError, match="environ-names"):
        EnvRegistry.from_dict({"names": []}, "x.json")
    with pytest.raises(RegistryError, match=r"pd_appliance\.sglang_args environ-names"):
        EnvRegistry.load(tmp_path / "absent.json")


def test_variant_sources_label_each_scope() -> None:
    variants = [{"name": "fast", "env_hooks": {"decode": {"SGLANG_X": "1"}, "common": {"A": None}}}]
    assert variant_sources(variants) == {
        "validation_variants[fast].env_hooks.decode": ["SGLANG_X"],
        "validation_variants[fast].env_hooks.common": ["A"],
    }


def test_a_worker_command_is_split_into_engine_and_sglang_argv() -> None:
    words = ["/t/python", "-m", "pd_appliance.serving.launch", "--env-file=/e", "--secret-arg=--api-key=KEY",
             "--", "/usr/bin/numactl", "--cpunodebind=1", "--membind=1", "--",
             "/s/python", "-m", "sglang.launch_server", "--model-path", "/m", "--port", "1"]  # fmt: skip
    engine, argv = rendered.split_engine_argv(words)
    assert engine == ["/s/python", "-m", "sglang.launch_server"]
    assert argv == ["--model-path", "/m", "--port", "1", "--api-key", "<secret from KEY>"]
    assert rendered.split_engine_argv(["/v/bin/sglang", "serve", "--port", "1"])[1] == ["--port", "1"]
    assert rendered.split_engine_argv(["/v/bin/pd-sim-worker", "--port", "1"])[0] == ["/v/bin/pd-sim-worker"]
    with pytest.raises(rendered.RenderedCommandError, match="numactl has no '--'"):
        rendered.split_engine_argv(["numactl", "--membind=0", "python", "-m", "sglang.launch_server"])
    with pytest.raises(rendered.RenderedCommandError, match="no SGLang engine command"):
        rendered.split_engine_argv(["/r/smg", "launch", "--pd-disaggregation"])


def test_engine_commands_reads_workers_of_a_conf_file(tmp_path: Path) -> None:
    conf = tmp_path / "pd.conf"
    conf.write_text(textwrap.dedent("""\
        ; Ansible managed
        [program:decode]
        command=%(here)s/python
            -m sglang.launch_server
            --model-path /m
            --served-model-name 100%%
        environment=A="1"
        [program:router]
        command=/r/smg launch --pd-disaggregation
        """))  # fmt: skip
    (command,) = rendered.engine_commands(conf)
    assert command.program == "decode" and command.engine[0] == f"{tmp_path}/python"
    assert command.argv == ["--model-path", "/m", "--served-model-name", "100%"]


@pytest.mark.slow
def test_preflight_stops_on_misspelt_hooks_before_anything_changes(rehearsal_inventory_copy: Path) -> None:
    # serving_env_decode is set per group (group_vars/decode.yml): the host's own file wins over it.
    (rehearsal_inventory_copy / "host_vars").mkdir()
    decode = {"serving_env_decode": {"SGLANG_SM120_FLASHMLA_BACKNED": "triton"}}
    (rehearsal_inventory_copy / "host_vars/localhost.yml").write_text(yaml.safe_dump(decode))
    broken = {
        "serving_env_common": {"SGL_DISAGGREGATION_NIXL_BACKEND": "UCX", "NCCL_DEBUG": "INFO"},
        "validation_variants": [
            {"name": "tilelang", "env_hooks": {"prefill": {"SGLANG_OPT_USE_TILELANG_INDEXR": "1"}}}
        ],
    }  # fmt: skip
    (rehearsal_inventory_copy / "group_vars/all/zz_broken.yml").write_text(yaml.safe_dump(broken))
    result = run_playbook("site.yml", rehearsal_inventory_copy)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Preflight found 3 problem(s); nothing was changed" in output, output[-4000:]
    flat = " ".join(output.split())
    assert "serving_env_decode sets SGLANG_SM120_FLASHMLA_BACKNED" in flat
    assert "did you mean SGLANG_SM120_FLASHMLA_BACKEND?" in flat
    assert "write SGLANG_DISAGGREGATION_NIXL_BACKEND" in flat
    assert "validation_variants[tilelang].env_hooks.prefill sets SGLANG_OPT_USE_TILELANG_INDEXR" in flat
    assert "PLAY [Provision" not in output
    assert not (rehearsal_inventory_copy.parent.parent / ".rehearsal").exists()
