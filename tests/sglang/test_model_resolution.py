"""SGLang 0.5.23's own model-config and quant-method resolution, for every rendered command line.

test_server_args.py parses the rendered worker command lines against a fake model, so SGLang never
makes a model-dependent choice there. Here every command line (the lab's prefill and decode, the
two-host layout, every tuning candidate in inventory/lab validation_variants) is resolved by the real
wheel in the parser venv against the rehearsal checkpoint, whose config.json has the real
nvidia/DeepSeek-V4-Flash-NVFP4 shape (pd_standins/data/deepseek_v4_flash_nvfp4.json, each field
with its source) and whose routed experts are U8 (packed FP4) in the safetensors headers, on a GPU
reported as compute capability (12, 0) (introspect.report_gpu; SGLang's own probes derive sm_120
from it). What runs: prepare_server_args + ServerArgs.resolve_once, publish and the scheduler's MoE /
GEMM backend initialisation, the loader's _get_quantization_config and get_quant_method for each
layer group at the DeepSeek-V4 model's prefixes (the draft's for MTP); what does not: building the
model (its constructors need a CUDA device and process groups) and the kernels (stood in for).

A choice the wheel marks SM100-only, or a fallback kernel, fails naming the layer group and the flag;
a candidate that declares `expect_unsupported_on_sm120` must show such a choice (and only in its MTP
groups), so the declaration cannot go stale. The record goes to artifacts/model-resolution/.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from rendered_layouts import lab_variants, rendered_workers
from sglang_testlib import SGLANG_VERSION
from supervisor.datatypes import dict_of_key_value_pairs
from supervisor.options import UnhosedConfigParser

from pd_appliance.bench.report import build_report
from pd_appliance.bench.report import render_markdown as render_report
from pd_appliance.sglang_args import resolution
from pd_appliance.sglang_args.real import RealSGLang
from pd_standins.hub import REAL_CONFIG_FILE, generate, real_checkpoint_config
from pd_testlib import ROOT

# The lab's GPU as SGLang sees it: RTX PRO 6000 Blackwell, sm_120, 97887 MiB (pd_standins.gpus),
# CUDA 13 (the pinned torch 2.14.1's).
LAB_GPU = {
    "capability": [12, 0], "memory_mib": 97887, "count": 8, "cuda": "13.0",
    "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
}  # fmt: skip
RECORD_DIR = ROOT / "artifacts" / "model-resolution"
MTP_GROUPS = ("MTP", "MTP MoE runner")
CONTROL = "control/decode-moe-runner-auto"

pytestmark = pytest.mark.slow


def _sglang_env(conf: Path, program: str, command_words: list[str]) -> dict[str, str]:
    """SGLANG_* of a worker: its env file (the launcher's --env-file) and its program environment."""
    env: dict[str, str] = {}
    for word in command_words:
        match = re.fullmatch(r"--env-file=(\S+)", word)
        if match and Path(match.group(1)).is_file():
            for line in Path(match.group(1)).read_text().splitlines():
                key, sep, value = line.partition("=")
                if sep and key.startswith("SGLANG_"):
                    env[key] = shlex.split(value)[0] if value else ""
    parser = UnhosedConfigParser()
    parser.read_string(conf.read_text())
    section = f"program:{program}"
    if parser.has_option(section, "environment"):
        pairs = dict_of_key_value_pairs(parser.get(section, "environment") % {})
        env.update({k: v for k, v in pairs.items() if k.startswith("SGLANG_")})
    return env


# Flags whose values only place an engine (where it listens): two command lines that differ in these
# alone resolve alike (SGLang's model config and quant methods do not read them), so each is asked once.
PLACEMENT_FLAGS = ("--host", "--port", "--disaggregation-bootstrap-port")


def _resolution_key(argv: list[str]) -> tuple[str, ...]:
    words = list(argv)
    for flag in PLACEMENT_FLAGS:
        if flag in words:
            del words[words.index(flag) : words.index(flag) + 2]
    return tuple(words)


def _with_model(argv: list[str], model: Path) -> list[str]:
    out = list(argv)
    out[out.index("--model-path") + 1] = str(model)
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("checkpoint") / "DeepSeek-V4-Flash-NVFP4"
    generate(target)
    return target


@pytest.fixture(scope="module")
def resolved(real: RealSGLang, lab: Path, two_hosts: Path, variant_hosts: Path, checkpoint: Path) -> dict:
    """label -> SGLang's answer, for every rendered worker command line; one process per env."""
    roots = [
        lab,
        two_hosts / "prefill",
        two_hosts / "decode",
        *(variant_hosts / v["name"] for v in lab_variants()),
    ]
    commands = rendered_workers(*roots)
    groups: dict[str, list[str]] = {}
    for label, command in commands.items():
        conf = Path(command.source)
        words = shlex.split(re.search(r"^command=(.*)$", conf.read_text(), re.M).group(1))  # type: ignore[union-attr]
        env = _sglang_env(conf, command.program, words)
        groups.setdefault(json.dumps(env, sort_keys=True), []).append(label)
    # A control that must fail: the lab's decode with --moe-runner-backend auto, which SGLang's
    # DeepSeek-V4 override turns into flashinfer_trtllm_routed for this checkpoint (SM100-only).
    control = list(commands["root/decode"].argv)
    control[control.index("--moe-runner-backend") + 1] = "auto"
    commands[CONTROL] = dataclasses.replace(commands["root/decode"], argv=control)
    next(labels for labels in groups.values() if "root/decode" in labels).append(CONTROL)
    answers: dict = {}
    platform: dict = {}
    for env_json, labels in sorted(groups.items()):
        keys = {label: _resolution_key(commands[label].argv) for label in labels}
        asked = {key: label for label, key in reversed(keys.items())}  # the first label of each key
        argvs = [_with_model(commands[label].argv, checkpoint) for label in asked.values()]
        result = real.resolve(argvs, LAB_GPU, json.loads(env_json))
        platform = result["platform"]
        by_key = dict(zip(asked, result["answers"], strict=True))
        for label, key in keys.items():
            argv = _with_model(commands[label].argv, checkpoint)
            answers[label] = dict(by_key[key], argv=argv, env=json.loads(env_json))
    RECORD_DIR.mkdir(parents=True, exist_ok=True)
    ordered = sorted(answers.items())
    (RECORD_DIR / "resolution.json").write_text(
        json.dumps(
            {"sglang_version": SGLANG_VERSION, "platform": platform, "answers": dict(ordered)}, indent=1
        )
    )
    markdown = resolution.render_markdown(ordered, platform)
    (RECORD_DIR / "resolution.md").write_text(markdown)
    print("\n" + markdown)
    return {"answers": answers, "platform": platform}


def test_sglang_sees_sm120_and_the_real_checkpoint_shape(resolved: dict) -> None:
    platform = resolved["platform"]
    assert platform["device_capability"] == [12, 0] and platform["is_sm120"] and not platform["is_sm100"]
    deployed = resolved["answers"]["root/decode"]
    assert deployed["ok"], deployed.get("error", "") + deployed["log"][-3000:]
    # The hybrid FP8 + NVFP4 path SGLang takes for the real checkpoint (configs/model_config.py).
    assert deployed["model"]["architectures"] == ["DeepseekV4ForCausalLM"]
    assert deployed["model"]["is_fp4_experts"] is True  # U8 routed experts in the safetensors header
    assert deployed["model"]["nvfp4_moe_meta"]["group_size"] == 16
    assert deployed["quant_config"] == "HybridFp8NvFp4Config"
    methods = {layer["group"]: layer["method"] for layer in deployed["layers"]}
    assert methods["routed MoE"] == "ModelOptNvFp4FusedMoEMethod"
    assert deployed["resolved"]["attention_backend"] == "dsv4"


def test_every_command_line_resolves_to_sm120_paths(resolved: dict) -> None:
    """No SM100-only choice or fallback, except in a candidate that declares it expects one."""
    expected = {v["name"]: v.get("expect_unsupported_on_sm120") for v in lab_variants()}
    problems = []
    for label, answer in sorted(resolved["answers"].items()):
        if label == CONTROL:
            continue
        found = resolution.findings(answer)
        variant = label.split("/", 1)[0]
        reason = expected.get(variant)
        if reason:
            if not found:
                problems.append(
                    f"{label}: declares expect_unsupported_on_sm120 but SGLang chose sm_120 paths"
                )
            elif any(not f.group.startswith(MTP_GROUPS) for f in found):
                problems += [f"{label}: {f}" for f in found if not f.group.startswith(MTP_GROUPS)]
            continue
        problems += [f"{label} (env {answer['env']}): {f}" for f in found]
    assert not problems, "SGLang 0.5.23 picks a path sm_120 lacks:\n" + "\n".join(problems)


def test_the_check_fails_a_choice_sglang_marks_sm100_only(resolved: dict) -> None:
    """The control: --moe-runner-backend auto on this checkpoint is flagged, naming the flag."""
    found = [str(f) for f in resolution.findings(resolved["answers"][CONTROL])]
    assert any(
        f.startswith("MoE runner: flashinfer_trtllm_routed (SM100-only") and resolution.FLAG_MOE in f
        for f in found
    ), found


def test_the_mtp_candidates_draft_moe_takes_the_sm100_path_that_keeps_mtp_off(resolved: dict) -> None:
    """Why MTP is off by default: the resolution shows it (and the deployed lab has no draft)."""
    answers = resolved["answers"]
    assert "draft" not in answers["root/decode"] and "draft" not in answers["root/prefill"]
    mtp = [
        name
        for name, reason in ((v["name"], v.get("expect_unsupported_on_sm120")) for v in lab_variants())
        if reason
    ]
    assert mtp == ["mtp-1", "mtp-2", "mtp-3"]
    for name in mtp:
        for role in ("prefill", "decode"):
            answer = answers[f"{name}/{role}"]
            draft = {layer["group"]: layer.get("method") for layer in answer["layers"]}
            assert answer["draft"]["architectures"] == ["DeepseekV4ForCausalLMNextN"]
            assert draft["MTP MoE"] in resolution.SM100_ONLY_METHODS, (name, role, draft)


def test_mtp_is_off_in_the_shipped_defaults_and_the_report_says_why() -> None:
    defaults = yaml.safe_load((ROOT / "roles/serving/defaults/main.yml").read_text())
    assert defaults["serving_speculative_algorithm"] == ""
    lab_serving = yaml.safe_load((ROOT / "inventory/lab/group_vars/all/serving.yml").read_text()) or {}
    assert lab_serving.get("serving_speculative_algorithm", "") == ""
    reason = yaml.safe_load((ROOT / "roles/validation/defaults/main.yml").read_text())[
        "validation_speculative_off_reason"
    ]
    assert "Mxfp4FlashinferTrtllmMoEMethod" in reason
    # The report the validation stage writes, with the metadata its facts task assembles.
    report = build_report([], "deployed", {}, metadata={"speculative_decoding": "off: " + reason}, error="x")
    assert f"speculative decoding (MTP): off: {reason}" in render_report(report)


def test_every_field_of_the_real_config_names_its_source() -> None:
    document = json.loads(REAL_CONFIG_FILE.read_text())
    config, provenance = document["config"], document["provenance"]
    assert set(provenance) == set(config)
    assert all(p["source"] and isinstance(p["reconstructed"], bool) for p in provenance.values())
    assert real_checkpoint_config() == config
    assert len(config["compress_ratios"]) == config["num_hidden_layers"] + config["num_nextn_predict_layers"]
