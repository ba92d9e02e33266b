"""The rehearsal engine refuses what SGLang 0.5.23 refuses for DeepSeek-V4 after its parser accepted it.

apply_deepseek_v4_defaults (sglang/srt/arg_groups/deepseek_v4_hook.py) asserts the speculative
algorithm as given (before NEXTN is aliased to EAGLE) and EAGLE's topk; the engine process then
dies with the AssertionError's traceback and status 1, before it listens. The architecture comes
from the checkpoint's config.json (tests/sglang/test_engine_model_checks.py checks the messages
against the wheel's source).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pd_standins.engine import cli, model_checks

V4 = "DeepseekV4ForCausalLM"
ALGORITHMS = f"Only EAGLE and DSPARK speculative algorithms are supported for {V4}"
TOPK = f"Only EAGLE speculative algorithm with topk == 1 is supported for {V4}"


@pytest.fixture
def v4(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [V4], "model_type": "deepseek_v4"}))
    return tmp_path


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (["--speculative-algorithm", "NEXTN"], ALGORITHMS),
        (["--speculative-algorithm", "eagle", "--speculative-eagle-topk", "1"], ALGORITHMS),
        (["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4"], TOPK),
        (["--speculative-algorithm", "EAGLE"], TOPK),  # topk's default is None, not 1
        # A flag given twice keeps its last value (argparse); an abbreviation resolves to the flag.
        (["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1", "--speculative-algo", "NEXTN"],
         ALGORITHMS),
        (["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1"], None),
        (["--speculative-algorithm", "DSPARK"], None),
        ([], None),
    ],
)  # fmt: skip
def test_deepseek_v4_speculative_refusals(v4: Path, flags: list[str], refusal: str | None) -> None:
    args = cli.parse_args(["--model-path", str(v4), "--tp-size", "4", *flags])
    assert model_checks.refusals(args, cli.load_flag_table()) == ([refusal] if refusal else [])


def test_other_models_and_paths_without_a_config_are_not_checked(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    for path in (str(tmp_path), "simulated-model", str(tmp_path / "missing")):
        args = cli.parse_args(["--model-path", path, "--speculative-algorithm", "NEXTN"])
        assert model_checks.refusals(args, cli.load_flag_table()) == []
    assert model_checks.model_arch(str(tmp_path)) == "DeepseekV3ForCausalLM"


def test_values_follow_each_flags_arity() -> None:
    table = cli.load_flag_table()
    # --lora-paths takes '*' values; the option string after them starts the next flag.
    args = cli.parse_args(["--model-path", "m", "--lora-paths", "a", "b", "--speculative-eagle-topk", "2"])
    values = model_checks.given_values(args.sim_ignored, table)
    assert values["lora_paths"] == ["a", "b"] and values["speculative_eagle_topk"] == ["2"]


def test_the_engine_process_dies_at_start_with_sglangs_assertion(v4: Path) -> None:
    argv = ["--model-path", str(v4), "--port", "1", "--speculative-algorithm", "NEXTN"]
    result = subprocess.run(
        [sys.executable, "-m", "pd_standins.engine.cli", *argv],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == f"AssertionError: {ALGORITHMS}"
    assert "Traceback (most recent call last)" in result.stderr
