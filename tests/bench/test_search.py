"""pd_appliance.bench.search: the declared stages, composition over kept configurations, the budget."""

from __future__ import annotations

import pytest

from pd_appliance.bench import search
from pd_appliance.bench.report import select_fastest

VARIANTS = [
    {"name": "pd-1p2-3d2", "description": "1P TP2 + 3D TP2", "vars": {"serving_instances": ["..."]}},
    {"name": "pd-2p2-2d2", "description": "2P TP2 + 2D TP2", "vars": {"serving_instances": ["2p2d"]}},
    {"name": "mtp-1", "vars": {"serving_speculative_algorithm": "EAGLE", "serving_speculative_num_steps": 1}},
    {"name": "mtp-2", "vars": {"serving_speculative_algorithm": "EAGLE", "serving_speculative_num_steps": 2}},
    {"name": "triton", "env_hooks": {"decode": {"SGLANG_SM120_FLASHMLA_BACKEND": "triton"}}},
    {"name": "unlisted", "vars": {"serving_decode_cuda_graph_max_bs": 16}},
]
SEARCH = [
    {"name": "topology", "variants": ["pd-1p2-3d2", "pd-2p2-2d2"], "keep": 2},
    {"name": "speculation", "variants": ["mtp-1", "mtp-2"]},
    {"name": "backend", "variants": ["triton"]},
]


def measured(name: str, c16: float, eligible: bool = True) -> dict:
    phases = [{"concurrency": 16, "output_tok_s": c16, "requests": 32, "errors": 0 if eligible else 32}]
    return {"variant": name, "probe": {"passed": True}, "phases": phases}


def test_a_declaration_that_cannot_run_names_each_stage_and_the_fix() -> None:
    names = [v["name"] for v in VARIANTS]
    bad = [
        {"name": "topology", "variants": ["pd-1p2-3d2", "typo"], "keep": 0},
        {"name": "again", "variants": ["pd-1p2-3d2"], "extra": 1},
        {"variants": []},
    ]
    errors = search.search_errors(bad, names)
    assert "validation_tune_search[0] (topology): variant 'typo' is not in validation_variants" in errors[0]
    assert any("keep must be a whole number >= 1, got 0" in e for e in errors)
    assert any("[1] (again): unknown keys ['extra']" in e for e in errors)
    assert any("[1] (again): variant 'pd-1p2-3d2' is already in an earlier stage" in e for e in errors)
    assert any("[2] (?): name must be a non-empty string" in e for e in errors)
    assert any("[2] (?): variants must be a non-empty list" in e for e in errors)
    assert search.search_errors(SEARCH, names) == []
    with pytest.raises(search.SearchError, match="typo"):
        search.stages(bad, VARIANTS)


def test_no_declared_search_is_every_variant_once_over_the_deployed_configuration() -> None:
    (only,) = search.stages([], VARIANTS)
    assert only["variants"] == [v["name"] for v in VARIANTS] and only["keep"] == 1
    assert search.not_searched([], VARIANTS) == []
    assert search.not_searched(SEARCH, VARIANTS) == [
        {"variant": "unlisted", "stage": "", "reason": "not in validation_tune_search"}
    ]


def test_a_stage_composes_each_variant_over_each_kept_configuration() -> None:
    deployed = {"name": "deployed"}
    topology = search.stage_candidates(SEARCH[0], [deployed], VARIANTS)
    assert [c["name"] for c in topology] == ["pd-1p2-3d2", "pd-2p2-2d2"]
    kept = [topology[1], deployed]
    speculation = search.stage_candidates(SEARCH[1], kept, VARIANTS)
    assert [c["name"] for c in speculation] == ["pd-2p2-2d2+mtp-1", "pd-2p2-2d2+mtp-2", "mtp-1", "mtp-2"]
    composed = speculation[1]
    assert composed["vars"] == {"serving_instances": ["2p2d"], "serving_speculative_algorithm": "EAGLE",
                                "serving_speculative_num_steps": 2}  # fmt: skip
    backend = search.stage_candidates(SEARCH[2], [composed], VARIANTS)[0]
    assert backend["name"] == "pd-2p2-2d2+mtp-2+triton"
    assert backend["env_hooks"] == {"decode": {"SGLANG_SM120_FLASHMLA_BACKEND": "triton"}}
    assert backend["vars"] == composed["vars"]


def test_env_hooks_merge_per_key_and_the_later_stage_wins_a_shared_name() -> None:
    base = {"name": "a", "env_hooks": {"decode": {"X": "1", "Y": "base"}, "prefill": {"P": "1"}}}
    over = {"name": "b", "env_hooks": {"decode": {"Y": "later"}}, "vars": {"serving_x": 2}}
    both = search.compose(base, over)
    assert both["env_hooks"] == {"decode": {"X": "1", "Y": "later"}, "prefill": {"P": "1"}}
    assert both["vars"] == {"serving_x": 2}


def test_the_best_eligible_configurations_are_kept_by_the_declared_objective() -> None:
    configurations = {"deployed": {}, "pd-1p2-3d2": VARIANTS[0], "pd-2p2-2d2": VARIANTS[1]}
    runs = [
        measured("deployed", 400.0),
        measured("pd-1p2-3d2", 900.0, eligible=False),
        measured("pd-2p2-2d2", 600.0),
    ]
    ranking = select_fastest(runs, 16)["ranking"]
    kept = search.keep_best(ranking, configurations, 2)
    # The fastest failed its requests: not kept; the deployed configuration goes on as the second.
    assert [k["name"] for k in kept] == ["pd-2p2-2d2", "deployed"]
    assert search.keep_best(ranking, configurations, 1) == [VARIANTS[1]]


def test_the_budget_stops_before_a_candidate_that_would_not_fit() -> None:
    assert search.budget_allows(0, 0, [], 600)["ok"]  # no budget
    assert search.budget_allows(100, 1000, [], 600)["ok"]
    first = search.budget_allows(500, 1000, [], 600)
    assert (
        not first["ok"] and "500 s of 1000 s spent" in first["reason"] and "first estimate" in first["reason"]
    )
    later = search.budget_allows(700, 1000, [250.0, 320.0], 600)
    assert not later["ok"] and "~320 s (the longest so far)" in later["reason"]
    assert search.budget_allows(600, 1000, [250.0, 320.0], 600)["ok"]


def test_a_dropped_base_is_named_with_the_stage_that_dropped_it() -> None:
    lines = search.not_carried(
        SEARCH[1], [{"name": "pd-2p2-2d2"}], ["deployed", "pd-1p2-3d2", "pd-2p2-2d2"], 1, "topology"
    )
    assert lines == [
        {"variant": "deployed+{mtp-1,mtp-2}", "stage": "speculation",
         "reason": "deployed was not among the best 1 of stage topology"},
        {"variant": "pd-1p2-3d2+{mtp-1,mtp-2}", "stage": "speculation",
         "reason": "pd-1p2-3d2 was not among the best 1 of stage topology"},
    ]  # fmt: skip


def test_a_whole_search_keeps_the_best_two_then_one_and_stops_at_the_budget() -> None:
    """What the validation role does stage by stage: the state carried between its tasks."""
    state = search.start(SEARCH, VARIANTS, budget_s=1000, started=0.0)
    figures = {"deployed": 400.0, "pd-1p2-3d2": 500.0, "pd-2p2-2d2": 300.0, "pd-1p2-3d2+mtp-1": 700.0,
               "pd-1p2-3d2+mtp-2": 650.0, "mtp-1": 450.0, "mtp-2": 420.0}  # fmt: skip
    runs = [measured("deployed", figures["deployed"])]
    clock = 0.0
    for stage in state["stages"]:
        state = search.begin_stage(state, stage, VARIANTS)
        for candidate in state["candidates"]:
            allowed = search.budget_check(state, clock, first_estimate_s=200)
            if not allowed["ok"]:
                state = search.record_candidate(state, candidate["name"], 0, allowed["reason"], stage["name"])
                continue
            clock += 150
            state = search.record_candidate(state, candidate["name"], 150)
            runs.append(measured(candidate["name"], figures[candidate["name"]]))
        state = search.end_stage(state, stage, runs, {"concurrency": 16})
    assert [h["kept"] for h in state["history"]] == [
        ["pd-1p2-3d2", "deployed"],
        ["pd-1p2-3d2+mtp-1"],
        ["pd-1p2-3d2+mtp-1"],  # the backend stage measured nothing: the budget was spent
    ]
    assert state["history"][1]["candidates"] == ["pd-1p2-3d2+mtp-1", "pd-1p2-3d2+mtp-2", "mtp-1", "mtp-2"]
    skipped = {s["variant"]: s["reason"] for s in state["skipped"]}
    assert skipped["unlisted"] == "not in validation_tune_search"
    assert skipped["pd-2p2-2d2+{mtp-1,mtp-2}"] == "pd-2p2-2d2 was not among the best 2 of stage topology"
    # 6 candidates of 150 s fill 900 s of the 1000 s: the seventh would not fit.
    assert (
        "pd-1p2-3d2+mtp-1+triton" in skipped and "900 s of 1000 s spent" in skipped["pd-1p2-3d2+mtp-1+triton"]
    )
    assert state["tried"]["pd-1p2-3d2+mtp-1"]["vars"]["serving_instances"] == ["..."]


def test_the_report_says_what_each_stage_kept_and_what_was_not_measured() -> None:
    state = search.start(SEARCH, VARIANTS, budget_s=3600, started=0.0)
    state = search.begin_stage(state, SEARCH[0] | {"keep": 2}, VARIANTS)
    state = search.record_candidate(state, "pd-1p2-3d2", 310.0)
    state = search.record_candidate(state, "pd-2p2-2d2", 0, "validation_tune_budget_s: spent", "topology")
    runs = [measured("deployed", 400), measured("pd-1p2-3d2", 500)]
    state = search.end_stage(state, SEARCH[0], runs, {"concurrency": 16})
    lines = "\n".join(search.markdown(search.summary(state)))
    assert "within validation_tune_budget_s = 3600 s; candidates took 310 s" in lines
    assert "| topology | pd-1p2-3d2, pd-2p2-2d2 | pd-1p2-3d2, deployed (best 2) |" in lines
    assert "- pd-2p2-2d2 (stage topology): validation_tune_budget_s: spent" in lines
    assert "- unlisted: not in validation_tune_search" in lines
    assert search.markdown(None) == [] and search.markdown({}) == []


def test_a_composed_name_is_a_candidate_name_but_not_a_declared_one() -> None:
    from pd_appliance.bench import variants

    composed = search.compose(VARIANTS[0], VARIANTS[2])
    assert composed["name"] == "pd-1p2-3d2+mtp-1"
    assert variants.variant_errors(composed, "serving_variant") == []
    declared = variants.variants_errors([{"name": "a+b"}], "validation_variants")
    assert declared and "name must be letters" in declared[0]


def test_the_labs_declared_search_names_its_candidates_and_covers_the_published_layouts() -> None:
    """inventory/lab: topology first (the TP2 layouts beside the deployed TP4 pair), MTP over the best
    two, then the decode backends and the PCIe all-reduce settings over the best one."""
    from pathlib import Path

    import yaml

    lab = yaml.safe_load(
        (Path(__file__).parents[2] / "inventory/lab/group_vars/all/validation.yml").read_text()
    )
    declared, variants = lab["validation_tune_search"], lab["validation_variants"]
    assert search.search_errors(declared, [v["name"] for v in variants]) == []
    assert [s["name"] for s in declared] == ["topology", "speculation", "backend"]
    assert search.not_searched(declared, variants) == []  # every shipped candidate is in a stage
    layouts = {
        v["name"]: v["vars"]["serving_instances"]
        for v in variants
        if "serving_instances" in v.get("vars", {})
    }
    assert (
        sorted((i["role"], i["tp_size"]) for i in layouts["pd-2p2-2d2"])
        == [("decode", 2)] * 2 + [("prefill", 2)] * 2
    )
    assert [i["role"] for i in layouts["pd-1p2-3d2"]].count("decode") == 3
