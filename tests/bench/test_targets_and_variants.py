"""The target line is reported, never gated; variants are checked, applied over a base, recorded."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from test_report import META, variant

from pd_appliance.bench import variants
from pd_appliance.bench.report import build_report, select_fastest, write_report

# The lab's own floors and target line, as shipped (inventory/lab/group_vars/all/validation.yml).
_LAB = yaml.safe_load((Path(__file__).parents[2] / "inventory/lab/group_vars/all/validation.yml").read_text())
_PROFILE = _LAB["validation_hardware_profiles"][_LAB["validation_hardware_profile"]]
THRESHOLDS = {1: _PROFILE["min_output_tok_s_bs1"], 16: _PROFILE["min_output_tok_s_c16"]}
TARGETS = {int(k): float(v) for k, v in _LAB["validation_target_output_tok_s"].items()}


def test_the_lab_floors_fail_the_seeds_deploy_and_targets_are_only_reported(tmp_path: Path) -> None:
    seeds = build_report([variant("deployed", 10.22, 28.0)], "deployed", THRESHOLDS, targets=TARGETS)
    assert not seeds["passed"]
    assert "bs=1 output throughput 10.22 tok/s < threshold 40.00" in seeds["failure_message"]
    assert "C=16 output throughput 28.00 tok/s < threshold 130.00" in seeds["failure_message"]
    healthy = build_report([variant("deployed", 85.0, 400.0)], "deployed", THRESHOLDS, targets=TARGETS)
    assert healthy["passed"]  # 40 % of the C=16 target, and still a pass: targets are not gates
    c16 = next(t for t in healthy["targets"] if t["level"] == "C=16")
    assert c16["fraction"] == pytest.approx(0.4) and c16["gap"] == pytest.approx(600.0)
    assert c16["message"] == "C=16: 400.0 tok/s is 40% of the target 1000 tok/s (600.0 tok/s short)"
    md = Path(write_report(healthy, tmp_path)["markdown"]).read_text()
    assert "## Distance to the target line (not gated)" in md
    assert "| C=16 | 400.0 | 1000 | 40% | 600.0 |" in md


def test_side_by_side_table_and_plot_show_every_variant(tmp_path: Path) -> None:
    runs = [variant("deployed", 50, 200), variant("mtp-off", 45, 260)]
    runs[1].update(vars={"serving_speculative_algorithm": ""}, description="MTP off")
    selection = select_fastest(runs, 16, THRESHOLDS)
    report = build_report(runs, "mtp-off", THRESHOLDS, selection=selection, metadata=META, targets=TARGETS)
    paths = write_report(report, tmp_path)
    md = Path(paths["markdown"]).read_text()
    assert "## Variants side by side" in md
    row = '| **mtp-off** | `serving_speculative_algorithm=""` | pass | 45.0 | 10.00 | 260.0 | 10.00 | - |'
    assert row in md
    assert "**fastest**" in md and "Objective: highest C=16 output tok/s subject to" in md
    assert Path(paths["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_candidate_that_never_came_up_is_reported_with_its_log_tail(tmp_path: Path) -> None:
    """What roles/tuning/tasks/apply.yml records for a candidate ruled out: why, the blamed
    programs' log tails (the Markdown shows their last lines), what was put back and its probe."""
    tail = "".join(f"line {i}\n" for i in range(40)) + "AssertionError: Only EAGLE and DSPARK ...\n"
    why = "gpu1: pd:decode on gpu1 did not become healthy: supervisor reports BACKOFF (Exited too quickly)"
    blamed = {
        "host": "gpu1",
        "program": "pd:decode",
        "state": "BACKOFF",
        "description": "Exited too quickly",
        "health": {},
        "log_tail": tail,
    }
    nextn = {
        "variant": "mtp-nextn", "phases": [],
        "vars": {"serving_decode_extra_args": ["--speculative-algorithm", "NEXTN"]},
        "probe": {"passed": False, "error": f"not measured: it did not come up: {why}"},
        "ruled_out": {
            "errors": [why], "programs": [blamed], "health_timeout_s": 900, "put_back": "deployed",
            "put_back_errors": [], "put_back_probe": {"passed": True, "answer": " Paris."},
        },
    }  # fmt: skip
    runs = [variant("deployed", 50, 200), nextn, variant("mtp-off", 45, 260)]
    selection = select_fastest(runs, 16, THRESHOLDS)
    assert {r["variant"]: r["eligible"] for r in selection["ranking"]}["mtp-nextn"] is False
    report = build_report(runs, "mtp-off", THRESHOLDS, selection=selection, metadata=META)
    assert report["passed"] and report["variants"][1]["ruled_out"]["put_back"] == "deployed"
    md = Path(write_report(report, tmp_path)["markdown"]).read_text()
    assert "| mtp-nextn |" in md and "ruled out: did not come up |" in md
    section = md.split("## Candidates ruled out (never came up)")[1].split("\n## ")[0]
    assert "**mtp-nextn** (deadline 900 s): gpu1: pd:decode on gpu1 did not become healthy" in section
    assert "Put back **deployed**, re-verified: healthy, and the probe answered ' Paris.'." in section
    assert "`pd:decode` on gpu1: BACKOFF (Exited too quickly); the last 15 lines of its log:" in section
    assert "  AssertionError: Only EAGLE and DSPARK ..." in section
    assert "line 26" in section and "line 25" not in section
    nextn["ruled_out"].update(put_back_probe={"passed": False, "error": "no answer"})
    md = Path(write_report(build_report(runs, "mtp-off", THRESHOLDS), tmp_path)["markdown"]).read_text()
    assert "Put back **deployed**, NOT re-verified: no answer." in md


KNOWN = ["serving_speculative_algorithm", "serving_decode_cuda_graph_max_bs", "serving_hf_token"]


@pytest.mark.parametrize(
    ("variant_def", "expected"),
    [
        ({"name": "deployed"}, "'deployed' is the configuration as served"),
        ({"name": "a b"}, "name must be letters"),
        ({"name": "x", "flags": []}, "unknown keys ['flags']"),
        ({"name": "x", "vars": {"serving_hf_token": "t"}}, "serving_hf_token cannot be set by a variant"),
        ({"name": "x", "vars": {"serving_env_decode": {}}}, "cannot be set by a variant (use env_hooks)"),
        ({"name": "x", "vars": {"appliance_root": "/"}}, "vars.appliance_root is not a serving variable"),
        ({"name": "x", "vars": {"serving_spec_algo": ""}}, "serving_spec_algo is not a variable of the"),
        ({"name": "x", "env_hooks": {"gpu": {}}}, "env_hooks.gpu is not one of"),
    ],
)
def test_variant_errors_name_the_variant_and_the_key(variant_def: dict, expected: str) -> None:
    errors = variants.variant_errors(variant_def, "validation_variants", KNOWN)
    assert any(expected in e for e in errors), errors
    assert all(e.startswith("validation_variants variant ") for e in errors)


def test_repeated_names_and_a_good_variant() -> None:
    good = {
        "name": "mtp-off",
        "vars": {"serving_speculative_algorithm": ""},
        "env_hooks": {"decode": {"A": 1}},
    }
    assert variants.variants_errors([good], "v", KNOWN) == []
    assert variants.variants_errors([good, good], "v", KNOWN) == ["v: variant names repeat: ['mtp-off']"]


def test_effective_restores_the_base_for_what_the_variant_does_not_set() -> None:
    base = {
        "serving_speculative_algorithm": "EAGLE",
        "serving_decode_cuda_graph_max_bs": 32,
        "serving_env_decode": {"KEEP": "1", "DROP": "2"},
    }
    first = {
        "name": "a",
        "vars": {"serving_decode_cuda_graph_max_bs": 16},
        "env_hooks": {"decode": {"DROP": None}},
    }
    assert variants.effective(base, first) == {
        "serving_speculative_algorithm": "EAGLE",
        "serving_decode_cuda_graph_max_bs": 16,
        "serving_env_decode": {"KEEP": "1", "DROP": None},
    }
    second = {"name": "b", "vars": {"serving_speculative_algorithm": ""}}
    assert variants.effective(base, second) == base | {"serving_speculative_algorithm": ""}
    assert variants.effective(base, {}) == base
    with pytest.raises(variants.VariantError, match="no base value captured for"):
        variants.effective({}, second)
    assert variants.override_names(first) == ["serving_decode_cuda_graph_max_bs", "serving_env_decode"]
    wanted = {"serving_speculative_algorithm": ""}
    assert variants.overridden_by_extra_vars(wanted, {"serving_speculative_algorithm": "EAGLE"}) == [
        "serving_speculative_algorithm"
    ]


def test_record_round_trip_and_a_damaged_record() -> None:
    chosen = {"name": "mtp-off", "vars": {"serving_speculative_algorithm": ""}}
    text = json.dumps(variants.record(chosen, objective="highest C=16 output tok/s", figures={"C=16": 1.0}))
    assert variants.parse_record(text, "/f") == {
        "name": "mtp-off", "description": "", "vars": {"serving_speculative_algorithm": ""}, "env_hooks": {},
    }  # fmt: skip
    with pytest.raises(variants.VariantError, match=r"/f is not JSON .*remove it to serve the inventory"):
        variants.parse_record("{oops", "/f")


def _variant_filters() -> dict:
    path = Path(__file__).resolve().parents[2] / "plugins/filter/pd_variants.py"
    spec = importlib.util.spec_from_file_location("pd_variants_filter", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


def test_candidate_values_are_checked_against_the_serving_roles_argument_spec() -> None:
    """The preflight's one-task check (roles/validation/tasks/preflight.yml) of every candidate's
    values: a wrong type or an unknown choice is named with its candidate, a good one passes."""
    root = Path(__file__).resolve().parents[2]
    spec = {}
    for role in ("appliance_defaults", "serving"):
        specs = yaml.safe_load((root / "roles" / role / "meta/argument_specs.yml").read_text())
        spec.update(specs["argument_specs"]["main"]["options"])
    check = _variant_filters()["pd_variants_argument_errors"]
    good = {"name": "bs-16", "vars": {"serving_decode_cuda_graph_max_bs": 16}}
    bad_type = {"name": "bs-many", "vars": {"serving_decode_cuda_graph_max_bs": "many"}}
    bad_layout = {"name": "no-gpus", "vars": {"serving_instances": [{"role": "decode", "gpus": "all"}]}}
    assert check([good, {"name": "hooks-only", "env_hooks": {}}], spec) == []
    errors = check([good, bad_type, bad_layout], spec)
    named = {e.split(": ", 1)[0] for e in errors}
    assert named == {"validation_variants[bs-many].vars", "validation_variants[no-gpus].vars"}, errors
    assert "serving_decode_cuda_graph_max_bs" in errors[0]
    assert "'all'" in errors[-1]
