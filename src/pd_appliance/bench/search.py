"""The tuner's declared search: stages of candidates, the best of each carried on, within a budget.

Topology x speculation x backend is too many configurations to measure blindly (each candidate is a
restart and a model load). validation_tune_search declares the order instead:

    validation_tune_search:
      - name: topology          # measured on the deployed configuration
        variants: [pd-1p2-3d2, pd-2p2-2d2]
        keep: 2                 # the best two (the deployed one may be among them) go on
      - name: speculation       # each variant on top of each configuration kept so far
        variants: [mtp-1, mtp-2, mtp-3]
        keep: 1
      - name: backend
        variants: [decode-attn-triton]

A stage's candidate is a variant of validation_variants composed over a kept configuration
(`compose`: the stage's vars and env hooks over the base's; named base+variant). The best
configurations by the declared objective (pd_appliance.bench.report.select_fastest, the same that
picks what to adopt) are kept for the next stage; `keep` defaults to 1. An empty search is
today's: every variant of validation_variants over the deployed configuration, one stage.

validation_tune_budget_s bounds the whole search: before each candidate, the time spent plus what
a candidate has taken so far (the longest one; before any, `first_estimate_s`) must fit, or the
candidate is skipped, as is everything after it. The report lists every configuration the search
did not measure and why (`skipped`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pd_appliance.bench.variants import DEPLOYED, ENV_HOOK_KEYS

STAGE_KEYS = frozenset({"name", "variants", "keep"})


class SearchError(ValueError):
    """A search declaration that cannot run; the message names the stage and the fix."""


def search_errors(
    search: Any, variant_names: Sequence[str], where: str = "validation_tune_search"
) -> list[str]:
    """Everything wrong with a declared search, each naming the stage."""
    if not isinstance(search, Sequence) or isinstance(search, (str, bytes)):
        return [f"{where} must be a list of stages (name, variants, keep), got {search!r}"]
    errors: list[str] = []
    seen: list[str] = []
    for index, stage in enumerate(search):
        label = f"{where}[{index}]"
        if not isinstance(stage, Mapping):
            errors.append(f"{label}: a stage is a mapping with name, variants and keep, got {stage!r}")
            continue
        label = f"{where}[{index}] ({stage.get('name', '?')})"
        unknown = sorted(set(stage) - STAGE_KEYS)
        if unknown:
            errors.append(f"{label}: unknown keys {unknown}; a stage has {sorted(STAGE_KEYS)}")
        if not isinstance(stage.get("name"), str) or not stage.get("name"):
            errors.append(f"{label}: name must be a non-empty string (it names the stage in the report)")
        names = stage.get("variants")
        if not isinstance(names, Sequence) or isinstance(names, (str, bytes)) or not names:
            errors.append(f"{label}: variants must be a non-empty list of names from validation_variants")
            names = []
        for name in names:
            if name not in variant_names:
                errors.append(
                    f"{label}: variant {name!r} is not in validation_variants ({sorted(variant_names)})"
                )
            elif name in seen:
                errors.append(f"{label}: variant {name!r} is already in an earlier stage")
            seen.append(name)
        keep = stage.get("keep", 1)
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            errors.append(f"{label}: keep must be a whole number >= 1, got {keep!r}")
    return errors


def stages(
    search: Sequence[Mapping[str, Any]], variants: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The search as run: the declared stages, or one stage of every variant when none is declared."""
    if not search:
        return [{"name": "every candidate", "variants": [v["name"] for v in variants], "keep": 1}]
    errors = search_errors(search, [v["name"] for v in variants])
    if errors:
        raise SearchError("; ".join(errors))
    return [
        {"name": s["name"], "variants": list(s["variants"]), "keep": int(s.get("keep", 1))} for s in search
    ]


def compose(base: Mapping[str, Any] | None, variant: Mapping[str, Any]) -> dict[str, Any]:
    """`variant` over `base`: its vars over the base's, its env hooks merged into the base's per key.

    The deployed configuration (None or named "deployed") is no override: the variant as it is.
    """
    if not base or base.get("name") == DEPLOYED:
        return {k: v for k, v in variant.items() if k in ("name", "description", "vars", "env_hooks")}
    hooks: dict[str, dict[str, Any]] = {k: dict(v or {}) for k, v in (base.get("env_hooks") or {}).items()}
    for key in ENV_HOOK_KEYS:
        if key in (variant.get("env_hooks") or {}):
            hooks[key] = {**hooks.get(key, {}), **(variant["env_hooks"][key] or {})}
    return {
        "name": f"{base['name']}+{variant['name']}",
        "description": "; ".join(str(v.get("description") or v["name"]) for v in (base, variant)),
        "vars": {**(base.get("vars") or {}), **(variant.get("vars") or {})},
        "env_hooks": hooks,
    }


def stage_candidates(
    stage: Mapping[str, Any], kept: Sequence[Mapping[str, Any]], variants: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Every candidate of a stage: each of its variants over each configuration kept so far."""
    by_name = {v["name"]: v for v in variants}
    return [compose(base, by_name[name]) for base in kept for name in stage["variants"]]


def keep_best(
    ranking: Sequence[Mapping[str, Any]],
    configurations: Mapping[str, Mapping[str, Any]],
    keep: int,
) -> list[dict[str, Any]]:
    """The `keep` best eligible configurations of a selection's ranking (best first), as definitions.

    `configurations` maps each measured name to its definition ({} or name "deployed" for the
    deployed configuration). Only measured, eligible ones are kept: a stage whose candidates all
    failed keeps what was kept before (the caller passes those in the ranking too).
    """
    best = [r["variant"] for r in ranking if r.get("eligible") and r["variant"] in configurations]
    return [dict(configurations[name]) or {"name": DEPLOYED} for name in best[:keep]]


def budget_allows(
    spent_s: float, budget_s: float, durations_s: Sequence[float], first_estimate_s: float
) -> dict[str, Any]:
    """Whether one more candidate fits the budget: spent + the longest candidate so far (or the
    first estimate) <= budget. A budget of 0 means none. Returns {ok, reason, estimate_s}."""
    estimate = max(durations_s) if durations_s else float(first_estimate_s)
    if budget_s <= 0 or spent_s + estimate <= budget_s:
        return {"ok": True, "reason": "", "estimate_s": estimate}
    return {
        "ok": False,
        "estimate_s": estimate,
        "reason": (
            f"validation_tune_budget_s: {spent_s:.0f} s of {budget_s:.0f} s spent, and a candidate takes "
            f"~{estimate:.0f} s ({'the longest so far' if durations_s else 'the first estimate'})"
        ),
    }


def not_searched(
    search: Sequence[Mapping[str, Any]], variants: Sequence[Mapping[str, Any]]
) -> list[dict[str, str]]:
    """The variants of validation_variants no declared stage names: never measured, said so."""
    if not search:
        return []
    named = {n for s in search for n in s.get("variants") or []}
    return [
        {"variant": v["name"], "stage": "", "reason": "not in validation_tune_search"}
        for v in variants
        if v["name"] not in named
    ]


def not_carried(
    stage: Mapping[str, Any],
    previous_kept: Sequence[Mapping[str, Any]],
    measured_before: Sequence[str],
    keep_before: int,
    stage_name_before: str,
) -> list[dict[str, str]]:
    """The combinations a stage does not try because their base was not among the best kept:
    one line per base measured earlier and dropped, naming the stage that dropped it."""
    kept = {c.get("name", DEPLOYED) for c in previous_kept}
    return [
        {
            "variant": f"{base}+{{{','.join(stage['variants'])}}}",
            "stage": str(stage["name"]),
            "reason": f"{base} was not among the best {keep_before} of stage {stage_name_before}",
        }
        for base in measured_before
        if base not in kept
    ]


# The search's state, as the validation role carries it between tasks (a JSON-able dict):
# stages, kept (definitions), tried (name -> definition), durations_s, skipped (lines), history
# (per stage: candidates and what was kept), started (epoch s), budget_s, candidates (this stage's).


def start(
    declared: Sequence[Mapping[str, Any]],
    variants: Sequence[Mapping[str, Any]],
    budget_s: float,
    started: float,
) -> dict[str, Any]:
    """The search before its first stage: the deployed configuration is the one kept."""
    return {
        "stages": stages(declared, variants),
        "kept": [{"name": DEPLOYED}],
        "tried": {},
        "measured": [DEPLOYED],
        "durations_s": [],
        "skipped": not_searched(declared, variants),
        "history": [],
        "started": float(started),
        "budget_s": float(budget_s),
        "candidates": [],
    }


def begin_stage(
    state: Mapping[str, Any], stage: Mapping[str, Any], variants: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """This stage's candidates (over what is kept), and the bases it does not build on, said so."""
    out = dict(state)
    out["candidates"] = stage_candidates(stage, state["kept"], variants)
    out["tried"] = {**state["tried"], **{c["name"]: c for c in out["candidates"]}}
    if state["history"]:
        before = state["history"][-1]
        out["skipped"] = [
            *state["skipped"],
            *not_carried(stage, state["kept"], state["measured"], before["keep"], before["stage"]),
        ]
    return out


def budget_check(state: Mapping[str, Any], now: float, first_estimate_s: float) -> dict[str, Any]:
    """budget_allows for the next candidate, from the state's start time and durations."""
    return budget_allows(
        float(now) - state["started"], state["budget_s"], state["durations_s"], first_estimate_s
    )


def record_candidate(
    state: Mapping[str, Any], name: str, seconds: float, skipped_reason: str = "", stage: str = ""
) -> dict[str, Any]:
    """A candidate measured (its duration counts toward later estimates) or skipped (and why)."""
    out = dict(state)
    if skipped_reason:
        out["skipped"] = [*state["skipped"], {"variant": name, "stage": stage, "reason": skipped_reason}]
    else:
        out["durations_s"] = [*state["durations_s"], round(float(seconds), 1)]
        out["measured"] = [*state["measured"], name]
    return out


def end_stage(
    state: Mapping[str, Any],
    stage: Mapping[str, Any],
    measurements: Sequence[Mapping[str, Any]],
    objective: Mapping[str, Any],
) -> dict[str, Any]:
    """Keep the stage's best: among what was kept before and this stage's measured candidates, by
    the declared objective (select_fastest's keyword arguments: concurrency, floors, max_error_rate,
    concurrency_levels). Nothing eligible keeps what was kept before."""
    from pd_appliance.bench.report import select_fastest  # the report renders the search (markdown)

    pool = {c.get("name", DEPLOYED): c for c in state["kept"]}
    pool.update({c["name"]: c for c in state["candidates"] if c["name"] in state["measured"]})
    ranking = select_fastest([m for m in measurements if m.get("variant") in pool], **objective)["ranking"]
    definitions = {name: ({} if name == DEPLOYED else dict(c)) for name, c in pool.items()}
    kept = keep_best(ranking, definitions, int(stage["keep"])) or list(state["kept"])
    out = dict(state)
    out["kept"] = kept
    out["history"] = [
        *state["history"],
        {"stage": stage["name"], "keep": int(stage["keep"]),
         "candidates": [c["name"] for c in state["candidates"]],
         "kept": [k.get("name", DEPLOYED) for k in kept]},
    ]  # fmt: skip
    out["candidates"] = []
    return out


def summary(state: Mapping[str, Any]) -> dict[str, Any]:
    """What the report keeps of the search: stages as run, what each kept, what was skipped and why,
    the budget and the time spent on candidates."""
    return {
        "stages": [dict(h) for h in state.get("history") or []],
        "kept": [k.get("name", DEPLOYED) for k in state.get("kept") or []],
        "skipped": [dict(s) for s in state.get("skipped") or []],
        "budget_s": state.get("budget_s"),
        "candidates_s": round(sum(state.get("durations_s") or []), 1),
    }


def markdown(search: Mapping[str, Any] | None) -> list[str]:
    """The report's "Search" section: stage by stage, then what was not measured and why."""
    if not search:
        return []
    budget = search.get("budget_s") or 0
    lines = [
        "",
        "## Search",
        "",
        f"Declared stages (validation_tune_search), within validation_tune_budget_s = "
        f"{f'{budget:g} s' if budget else 'none'}; candidates took {search.get('candidates_s', 0):g} s.",
        "",
        "| stage | measured | kept (best first) |",
        "| --- | --- | --- |",
    ]
    for stage in search.get("stages") or []:
        kept = ", ".join(stage["kept"])
        lines.append(
            f"| {stage['stage']} | {', '.join(stage['candidates']) or '-'} | {kept} (best {stage['keep']}) |"
        )
    skipped = search.get("skipped") or []
    if skipped:
        lines += ["", "Not measured:", ""]
        for line in skipped:
            where = f" (stage {line['stage']})" if line.get("stage") else ""
            lines.append(f"- {line['variant']}{where}: {line['reason']}")
    return lines
