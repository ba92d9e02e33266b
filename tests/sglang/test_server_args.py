"""SGLang 0.5.23's own parser decides: every rendered worker command line, the derived files.

A venv with the real wheel (patched like the lab's; CPU torch; only what the parser imports) is
built once under artifacts/sglang-parser and reused while its inputs stay the same. The serving
role renders the shipped lab layout, a two-host variant and a misspelt decode flag with
--tags serving_render (GPU facts given as NVML-shaped data); the worker commands are read back
from conf.d and parsed by `sglang.srt.server_args.prepare_server_args`, the function
`python -m sglang.launch_server` calls, and by the rehearsal engine, which must agree.

The lab's tuning candidates (inventory/lab/group_vars/all/validation.yml, validation_variants)
change launch flags and env hooks: each is rendered as the serving role applies it (serving_variant,
one host per candidate in one play) and every worker command line goes through the same parser.
Their hook names are checked by preflight (test_server_args_env.py).
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest
from rendered_layouts import CONF_D, lab_variants, render_layout, render_vars, rendered_workers
from sglang_testlib import SGLANG_VERSION
from supervisor.datatypes import dict_of_key_value_pairs
from supervisor.options import UnhosedConfigParser

from pd_appliance.sglang_args import derived, rendered
from pd_appliance.sglang_args.real import RealSGLang, Verdict
from pd_appliance.sglang_args.registry import EnvRegistry, env_name_errors
from pd_standins.engine import cli as engine_cli
from pd_testlib import ROOT

pytestmark = pytest.mark.slow

MISSPELT = "--cuda-graph-max-bs-deocde"
# What the engine simulates, compared with what SGLang parsed from the same command line.
ENGINE_FIELDS = {
    "model_path": "model_path", "served_model_name": "served_model_name", "tp_size": "tp_size",
    "host": "host", "port": "port", "disaggregation_mode": "role",
    "disaggregation_bootstrap_port": "bootstrap_port", "enable_metrics": "enable_metrics",
}  # fmt: skip


def check_rendered(real: RealSGLang, commands: dict[str, rendered.EngineCommand]) -> dict[str, Verdict]:
    """SGLang's verdict on each rendered worker command (one process for all of them)."""
    labels = sorted(commands)
    verdicts = real.parse([commands[k].argv for k in labels], fields=list(ENGINE_FIELDS))
    return dict(zip(labels, verdicts, strict=True))


def _engine_refusal(argv: list[str]) -> tuple[int, str]:
    """The rehearsal engine's parse of argv, in-process: (exit status, stderr); (0, '') accepts."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            engine_cli.config_from_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0), err.getvalue()
    return 0, err.getvalue()


def _error_line(message: str) -> str:
    """argparse's error, without the program name (sglang serve / pd-sim-worker)."""
    line = next(x for x in message.splitlines() if ": error: " in x)
    return line.split(": error: ", 1)[1]


def test_lab_and_two_host_commands_pass_sglangs_parser_and_the_engine_reads_them_alike(
    real: RealSGLang, lab: Path, two_hosts: Path
) -> None:
    commands = rendered_workers(lab, two_hosts / "prefill", two_hosts / "decode")
    assert sorted(commands) == ["decode/decode", "prefill/prefill", "root/decode", "root/prefill"]
    assert all(c.engine[1:] == ["-m", "sglang.launch_server"] for c in commands.values())
    assert "--disable-cuda-graph" in commands["decode/decode"].argv  # the deprecated spelling SGLang keeps
    assert "--api-key" in commands["root/prefill"].argv  # the launcher's secret flag, as SGLang sees it
    for label, verdict in check_rendered(real, commands).items():
        assert verdict.ok, f"SGLang {SGLANG_VERSION} refuses {commands[label].label()}: {verdict.message}"
        config, _ = engine_cli.config_from_args(commands[label].argv)
        engine = {field: getattr(config, attr) for field, attr in ENGINE_FIELDS.items()}
        assert engine == verdict.values, label


def test_a_misspelt_flag_is_refused_by_sglang_and_by_the_rehearsal_engine(
    real: RealSGLang, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("misspelt") / "root"
    variables = render_vars(
        root, serving_advertise_host="192.0.2.10", serving_decode_extra_args=[MISSPELT, "16"]
    )
    render_layout(ROOT / "inventory/lab", variables, tmp_path_factory.mktemp("misspeltvars"))
    commands = rendered_workers(root)
    verdicts = check_rendered(real, commands)
    decode, prefill = verdicts["root/decode"], verdicts["root/prefill"]
    assert prefill.ok
    assert not decode.ok and decode.exit_code == 2
    assert f"unrecognized arguments: {MISSPELT} 16" in decode.message
    # The engine as supervisord starts it in a rehearsal: its own process, the rendered argv.
    engine = subprocess.run(
        [sys.executable, "-m", "pd_standins.engine.cli", *commands["root/decode"].argv],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert engine.returncode == 2, engine.stderr
    assert _error_line(engine.stderr) == _error_line(decode.message)
    # The CLI a later change (launch-flag variants) reuses says the same and exits 1.
    cli = subprocess.run(
        [sys.executable, "-m", "pd_appliance.sglang_args", "check", "--python", str(real.python),
         str(root / CONF_D / "decode.conf"), str(root / CONF_D / "prefill.conf")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "REFUSED" in cli.stdout and MISSPELT in cli.stdout and "accepted 1 of 2" in cli.stdout


# argv -> what it exercises. SGLang and the engine must accept and refuse alike, same message.
CORPUS = {
    "plain": ["--model-path", "m"],
    "aliases and = form": ["--model=m", "--tensor-parallel-size=2", "--port=31000"],
    "unique abbreviation": ["--model-path", "m", "--disaggregation-transfer", "nixl"],
    "ambiguous abbreviation": ["--model-path", "m", "--enable-metric"],
    "unknown flag": ["--model-path", "m", "--enable-metircs"],
    "bad choice": ["--model-path", "m", "--disaggregation-mode", "both"],
    "bad int choice": ["--model-path", "m", "--log-requests-level", "7"],
    "missing value": ["--model-path", "m", "--tp-size"],
    "value that is a flag": ["--model-path", "m", "--host", "--port", "1"],
    "missing required flag": ["--tp-size", "4"],
    "bad int": ["--model-path", "m", "--tp-size", "four"],
    "bad float": ["--model-path", "m", "--mem-fraction-static", "most"],
    "human int": ["--model-path", "m", "--context-length", "128k"],
    "bad human int": ["--model-path", "m", "--context-length", "12x"],
    "bad JSON": ["--model-path", "m", "--default-chat-template-kwargs", "{bad"],
    "several values": ["--model-path", "m", "--cuda-graph-bs-decode", "1", "2", "4"],
    "several values, none given": ["--model-path", "m", "--cuda-graph-bs-decode"],
    "boolean optional": ["--model-path", "m", "--no-enable-tf32-matmul"],
    "deprecated flags": ["--model-path", "m", "--disable-cuda-graph", "--enable-dp-attention"],
    "deprecated flag with a choice": ["--model-path", "m", "--monokernel-backend", "nvidia"],
    "stray positional": ["--model-path", "m", "extra"],
}

# Refused by a converter function whose message SGLang words itself; the engine names the flag.
WORDED_DIFFERENTLY = {"bad human int", "bad JSON"}


def test_engine_accepts_and_refuses_what_sglang_does(real: RealSGLang) -> None:
    labels = sorted(CORPUS)
    verdicts = real.parse([CORPUS[k] for k in labels])
    assert sum(v.ok for v in verdicts) >= 6 and sum(not v.ok for v in verdicts) >= 10
    for label, verdict in zip(labels, verdicts, strict=True):
        status, message = _engine_refusal(CORPUS[label])
        assert status == (verdict.exit_code if not verdict.ok else 0), (label, verdict.message, message)
        if verdict.ok:
            continue
        ours, theirs = _error_line(message), _error_line(verdict.message)
        if label in WORDED_DIFFERENTLY:  # a converter's own words: the same flag is named
            ours, theirs = ours.split(": ", 1)[0], theirs.split(": ", 1)[0]
        assert ours == theirs, label


def test_engine_flag_table_is_the_wheels(real: RealSGLang) -> None:
    committed = ROOT / derived.FLAG_TABLE_PATH
    regenerated = derived.dumps(derived.flag_table_document(real))
    assert regenerated == committed.read_text(), (
        f"{committed} drifted from the SGLang {SGLANG_VERSION} wheel: run "
        f"`python -m pd_appliance.sglang_args flags` and commit the result"
    )


def test_environ_registry_is_the_wheels(real: RealSGLang) -> None:
    committed = ROOT / derived.ENVIRON_NAMES_PATH.format(version=SGLANG_VERSION)
    regenerated = derived.dumps(derived.environ_names_document(real, ROOT))
    assert regenerated == committed.read_text(), (
        f"{committed} drifted from the SGLang {SGLANG_VERSION} wheel (or the patch series): run "
        f"`python -m pd_appliance.sglang_args environ-names` and commit the result"
    )


def test_rendered_env_hooks_are_names_sglang_reads(lab: Path, two_hosts: Path) -> None:
    """The hooks the serving role renders itself (defaults, role-only switches) pass the registry."""
    registry = EnvRegistry.load(ROOT / derived.ENVIRON_NAMES_PATH.format(version=SGLANG_VERSION))
    sources: dict[str, list[str]] = {}
    for root in (lab, two_hosts / "prefill", two_hosts / "decode"):
        for env_file in sorted((root / "etc/pd-appliance/serving").glob("*.env")):
            sources[str(env_file)] = [
                line.split("=", 1)[0] for line in env_file.read_text().splitlines() if "=" in line
            ]
        for conf in sorted((root / CONF_D).glob("*.conf")):
            parser = UnhosedConfigParser()
            parser.read_string(conf.read_text())
            for section in parser.sections():
                if parser.has_option(section, "environment"):
                    env = dict_of_key_value_pairs(parser.get(section, "environment") % {})
                    sources[f"{conf} [{section}]"] = list(env)
    names = {n for found in sources.values() for n in found if n.startswith("SGLANG_")}
    assert {"SGLANG_SM120_FLASHMLA_BACKEND", "SGLANG_OPT_USE_TILELANG_INDEXER"} <= names
    assert env_name_errors("lab", sources, registry) == []


def test_every_lab_variant_renders_command_lines_sglangs_parser_accepts(
    real: RealSGLang, variant_hosts: Path, lab: Path
) -> None:
    variants = {v["name"]: v for v in lab_variants()}
    commands = rendered_workers(*(variant_hosts / name for name in variants))
    # A topology candidate renders its serving_instances; the others the lab's prefill and decode.
    workers = {
        name: len(v.get("vars", {}).get("serving_instances") or [None, None]) for name, v in variants.items()
    }
    assert len(commands) == sum(workers.values())
    verdicts = check_rendered(real, commands)
    for label, verdict in verdicts.items():
        assert verdict.ok, f"SGLang {SGLANG_VERSION} refuses {commands[label].label()}: {verdict.message}"
    # The aggregated candidates: SGLang's own default mode "null" (one engine does prefill and decode),
    # no PD flag at all, both phases' CUDA graphs; the rehearsal engine reads them alike.
    aggregated = {k: c for k, c in commands.items() if k.startswith("agg-")}
    assert sorted(aggregated) == [
        "agg-2x-tp4/aggregated-0", "agg-2x-tp4/aggregated-1", "agg-4x-tp2/aggregated-0",
        "agg-4x-tp2/aggregated-1", "agg-4x-tp2/aggregated-2", "agg-4x-tp2/aggregated-3",
    ]  # fmt: skip
    for label, command in aggregated.items():
        assert verdicts[label].values["disaggregation_mode"] == "null", label
        assert not [w for w in command.argv if w.startswith("--disaggregation")], label
        assert "--cuda-graph-max-bs-decode" in command.argv, label
        config, _ = engine_cli.config_from_args(command.argv)
        assert {f: getattr(config, a) for f, a in ENGINE_FIELDS.items()} == verdicts[label].values, label
    assert {k: c.argv[c.argv.index("--tp-size") + 1] for k, c in aggregated.items() if "4x-tp2" in k} == {
        f"agg-4x-tp2/aggregated-{i}": "2" for i in range(4)
    }
    deployed = rendered_workers(lab)["root/decode"].argv
    # Each candidate's overrides reach the command line or the environment, and nothing else changes.
    decode = {name: commands[f"{name}/decode"].argv for name in variants if f"{name}/decode" in commands}
    # MTP is off as shipped (roles/serving/defaults/main.yml); the mtp-N candidates turn it on.
    assert "--speculative-algorithm" not in deployed and "--speculative-algorithm" in decode["mtp-1"]
    assert decode["mtp-1"][decode["mtp-1"].index("--speculative-num-steps") + 1] == "1"
    assert decode["mtp-3"][decode["mtp-3"].index("--speculative-num-draft-tokens") + 1] == "4"
    graphs = decode["decode-cuda-graph-bs-16"]
    assert graphs[graphs.index("--cuda-graph-max-bs-decode") + 1] == "16"
    env = {name: (variant_hosts / name / CONF_D / "decode.conf").read_text() for name in decode}
    assert 'SGLANG_SM120_FLASHMLA_BACKEND="pd_splitkv"' in env["decode-attn-pd-splitkv"]
    assert 'SGLANG_OPT_SM120_DIRECT_SWA_KV="1"' in env["direct-swa-kv"]
    # The topology candidates: TP2 engines on the GPUs their serving_instances name.
    tp = {
        k.split("/")[1]: c.argv[c.argv.index("--tp-size") + 1]
        for k, c in commands.items()
        if k.startswith("pd-2p2")
    }
    assert tp == {"prefill-0": "2", "prefill-1": "2", "decode-0": "2", "decode-1": "2"}
    assert sorted(k for k in commands if k.startswith("pd-1p2-3d2/")) == [
        "pd-1p2-3d2/decode-0", "pd-1p2-3d2/decode-1", "pd-1p2-3d2/decode-2", "pd-1p2-3d2/prefill"
    ]  # fmt: skip
    dp = decode["decode-dp-attention"]
    assert dp[dp.index("--attn-dp-size") + 1] == "4" and "--attn-dp-size" not in deployed
    assert "--disable-custom-all-reduce" in decode["no-custom-all-reduce"]
    assert "--disable-custom-all-reduce" in commands["no-custom-all-reduce/prefill"].argv
    assert 'NCCL_P2P_DISABLE="1"' in env["nccl-p2p-off"]
