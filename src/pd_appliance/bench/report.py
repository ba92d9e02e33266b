"""The validation report: gates over the running variant, every variant side by side.

JSON holds every figure (the machine-readable record); Markdown is what a person reads; the
PNG plots throughput and latency percentiles per concurrency. matplotlib is imported only when
the plot is drawn, so a host without it still gets the JSON and the Markdown.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pd_appliance
from pd_appliance.bench import SCHEMA_VERSION, engine_choices, gates, history, roofline, search
from pd_appliance.files import write_atomic


class ReportError(ValueError):
    """The inputs of a report do not fit together; the message says which."""


def _ineligible_reasons(
    measurement: Mapping[str, Any],
    concurrency: int,
    floors: Mapping[int, float],
    max_error_rate: float,
    concurrency_levels: Sequence[int],
) -> list[str]:
    """Why a variant cannot be adopted: the gates it would fail, and a missing objective level."""
    levels = {concurrency: 0.0, **{int(c): float(f) for c, f in floors.items()}}
    checks = gates.throughput_gates(measurement, levels, max_error_rate)
    checks += gates.decode_concurrency_gates(measurement, concurrency_levels)
    return [g.message for g in checks if not g.passed]


def select_fastest(
    measurements: Sequence[Mapping[str, Any]],
    concurrency: int,
    floors: Mapping[int, float] | None = None,
    max_error_rate: float = 0.0,
    concurrency_levels: Sequence[int] = (),
) -> dict[str, Any]:
    """The declared objective: the highest output tok/s at `concurrency` among variants that pass.

    A variant is eligible when its probe passed and, at the objective level and every level of
    `floors` (per-concurrency minimum output tok/s: the gates' thresholds plus any stricter
    adoption floor, e.g. "C=16 subject to bs=1 >= 80"), it met the floor with no more failed
    requests than `max_error_rate` allows and, at `concurrency_levels`, the decode workers reached
    the concurrency asked for. Ineligible variants are ranked too, with the reasons.
    """
    floors = dict(floors or {})
    ranking: list[dict[str, Any]] = []
    for m in measurements:
        phase = next((p for p in m.get("phases") or [] if int(p["concurrency"]) == concurrency), None)
        reasons = _ineligible_reasons(m, concurrency, floors, max_error_rate, concurrency_levels)
        ranking.append(
            {
                "variant": m.get("variant"),
                "eligible": not reasons,
                "output_tok_s": float(phase["output_tok_s"]) if phase else None,
                "reasons": reasons,
            }
        )
    candidates = [r for r in ranking if r["eligible"]]
    fastest = max(candidates, key=lambda r: r["output_tok_s"])["variant"] if candidates else None
    ranking.sort(key=lambda r: (not r["eligible"], -(r["output_tok_s"] or 0.0)))
    floor_text = ", ".join(f"{gates.concurrency_label(c)} >= {f:g} tok/s" for c, f in sorted(floors.items()))
    objective = f"highest {gates.concurrency_label(concurrency)} output tok/s" + (
        f" subject to {floor_text}" if floor_text else ""
    )
    return {
        "concurrency": concurrency,
        "objective": objective,
        "floors": {gates.concurrency_label(c): f for c, f in sorted(floors.items())},
        "fastest": fastest,
        "ranking": ranking,
    }


def build_report(
    measurements: Sequence[Mapping[str, Any]],
    selected_variant: str,
    thresholds: Mapping[int, float],
    regression_tolerance: float | None = None,
    last_accepted: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    selection: Mapping[str, Any] | None = None,
    max_error_rate: float = 0.0,
    error: str = "",
    history_error: str = "",
    final_probe: Mapping[str, Any] | None = None,
    targets: Mapping[int, float] | None = None,
    decode_concurrency_levels: Sequence[int] = (),
    engine_startup: engine_choices.EngineStartup | None = None,
) -> dict[str, Any]:
    """Gate the selected (running) variant and assemble the full report.

    `error` is why nothing was measured (used when `measurements` is empty); `history_error` is
    why the regression baseline could not be read; either fails the report. `final_probe` is the
    probe run after switching to the selected variant at the end of an A/B: it must pass too.
    `decode_concurrency_levels` are the levels whose decode concurrency is gated (the running-
    requests gauge must reach the level); `targets` (per-concurrency output tok/s) are reported as
    a distance, never gated. `engine_startup` ({host: {instance: record}}, what each worker's engine
    chose at start-up) is listed, and a fallback named there fails (engine_choices.gates).
    """
    if not measurements:
        # The measurement itself broke (the play passes its error in): report that, gated as failed.
        measurements = [
            {"variant": selected_variant, "probe": {"passed": False, "error": error or "not measured"}}
        ]
    by_name = {m.get("variant"): m for m in measurements}
    if selected_variant not in by_name:
        raise ReportError(
            f"selected variant {selected_variant!r} is not among the measured {sorted(map(str, by_name))}"
        )
    selected = by_name[selected_variant]
    gate_list = gates.throughput_gates(selected, thresholds, max_error_rate)
    gate_list += gates.decode_concurrency_gates(selected, decode_concurrency_levels)
    if final_probe is not None:
        ok = bool(final_probe.get("passed"))
        detail = final_probe.get("error") or f"answer {final_probe.get('answer', '')!r}"
        gate = gates.Gate("final probe", ok, f"probe after switching to '{selected_variant}': {detail}")
        gate_list.append(gate)
    if history_error:
        gate_list.append(gates.Gate("regression history", False, f"history unreadable: {history_error}"))
    gate_list += gates.regression_gates(selected, last_accepted, regression_tolerance)
    gate_list += engine_choices.gates(engine_startup)
    per_variant = {
        name: gates.all_passed(
            gates.throughput_gates(m, thresholds, max_error_rate)
            + gates.decode_concurrency_gates(m, decode_concurrency_levels)
        )
        for name, m in by_name.items()
    }
    passed = gates.all_passed(gate_list)
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "passed": passed,
        "failure_message": gates.failure_message(gate_list, selected_variant),
        "selected_variant": selected_variant,
        "thresholds": {gates.concurrency_label(c): t for c, t in sorted(thresholds.items())},
        "targets": gates.target_distances(selected, targets or {}),
        "decode_concurrency_levels": sorted(decode_concurrency_levels),
        "max_error_rate": max_error_rate,
        "regression_tolerance": regression_tolerance,
        "regression_tolerances": {
            label: t.as_dict()
            for label, t in gates.regression_tolerances(selected, regression_tolerance).items()
        },
        "last_accepted": dict(last_accepted) if last_accepted else None,
        "gates": [g.as_dict() for g in gate_list],
        "variants_passing_floors": per_variant,
        "selection": dict(selection) if selection else None,
        "final_probe": dict(final_probe) if final_probe is not None else None,
        "figures": gates.regression_figures(selected),
        "metadata": {"pd_appliance_version": pd_appliance.__version__, **dict(metadata or {})},
        "variants": [dict(m) for m in measurements],
        "engine_startup": {host: dict(p) for host, p in (engine_startup or {}).items()},
    }


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pcts(summary: Mapping[str, Any] | None) -> str:
    summary = summary or {}
    return " / ".join(_fmt(summary.get(k)) for k in ("p50", "p90", "p99"))


def figure_with_spread(phase: Mapping[str, Any]) -> str:
    """A level's output tok/s with the spread of its waves, e.g.
    "1,234 tok/s (p10 1,200 / p90 1,260, CV 2.1 %, 6 waves, 61 s)"."""
    figure = f"{float(phase['output_tok_s']):,.0f} tok/s"
    spread = phase.get("spread") or {}
    if not spread.get("waves"):
        return figure + " (no waves: measured before steady-state waves)"
    failed = (
        f", {spread['failed_waves']} with a failed request left out" if spread.get("failed_waves") else ""
    )
    counts = f"{spread['waves']} waves{failed}, {spread['measured_s']:.0f} s"
    if spread.get("p50") is None:
        return f"{figure} (no spread: every wave had a failed request; {counts})"
    cv = f"{spread['cv'] * 100:.1f} %" if spread.get("cv") is not None else "-"
    return f"{figure} (p10 {spread['p10']:,.0f} / p90 {spread['p90']:,.0f}, CV {cv}, {counts})"


def _spread_lines(report: Mapping[str, Any]) -> list[str]:
    """Markdown: every variant's figure at each level with its spread over the measured waves."""
    lines = ["", "## Throughput and its spread", ""]
    lines.append(
        "Output tok/s of each level over its measured waves (a wave: as many completed requests as the "
        "concurrency); p10 / p90 and the CV (stdev / mean) are of the per-wave figures."
    )
    lines.append("")
    rows = [
        f"- **{m.get('variant')}** {gates.concurrency_label(int(p['concurrency']))}: {figure_with_spread(p)}"
        for m in report["variants"]
        for p in m.get("phases") or []
    ]
    return lines + rows if rows else []


def _tolerance_lines(report: Mapping[str, Any]) -> list[str]:
    """Markdown: the regression tolerance each level was gated with, and why that one."""
    tolerances = report.get("regression_tolerances") or {}
    if not tolerances or not report.get("last_accepted"):
        return []
    lines = [
        "",
        "Regression tolerance applied (the configured one, or the waves' spread where that is wider):",
        "",
    ]
    for label, t in tolerances.items():
        fields = {k: t.get(k) for k in ("applied", "configured", "spread", "waves")}
        lines.append(f"- {label}: {gates.Tolerance(**fields).text()}")
    return lines


def overrides_text(measurement: Mapping[str, Any]) -> str:
    """A variant's overrides in one line: `var=value` and `role: HOOK=value`."""
    parts = [f"{k}={json.dumps(v)}" for k, v in sorted((measurement.get("vars") or {}).items())]
    for role, hooks in sorted((measurement.get("env_hooks") or {}).items()):
        parts += [f"{role}: {k}={json.dumps(v)}" for k, v in sorted((hooks or {}).items())]
    return ", ".join(parts)


def _levels(report: Mapping[str, Any]) -> list[int]:
    return sorted({int(p["concurrency"]) for m in report["variants"] for p in m.get("phases") or []})


def side_by_side(report: Mapping[str, Any]) -> list[str]:
    """Markdown: one row per variant, its figures at every level, and the tuner's verdict."""
    levels = _levels(report)
    selection = report.get("selection") or {}
    ranking = {r["variant"]: r for r in selection.get("ranking") or []}
    header = ["variant", "overrides", "probe"]
    for c in levels:
        label = gates.concurrency_label(c)
        header += [f"{label} tok/s", f"{label} TPOT p50 ms"] + ([f"{label} decode peak"] if c > 1 else [])
    header += ["tuner"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for m in report["variants"]:
        phases = {int(p["concurrency"]): p for p in m.get("phases") or []}
        name = m.get("variant")
        row = [
            f"**{name}**" if name == report["selected_variant"] else str(name),
            f"`{overrides_text(m)}`" if overrides_text(m) else (m.get("description") or "-"),
            "pass" if (m.get("probe") or {}).get("passed") else "**FAIL**",
        ]
        for c in levels:
            p = phases.get(c)
            row += [
                _fmt(float(p["output_tok_s"]), 1) if p else "-",
                _fmt((p.get("tpot_ms") or {}).get("p50"), 2) if p else "-",
            ]
            if c > 1:
                running = (p or {}).get("decode_running") or {}
                row.append(f"{_fmt(running.get('peak'), 0)} of {c}" if running else "-")
        verdict = ranking.get(name)
        if m.get("ruled_out"):
            row.append("ruled out: did not come up")
        elif verdict is None:
            row.append("-")
        elif name == selection.get("fastest"):
            row.append("**fastest**")
        elif verdict["eligible"]:
            row.append("eligible")
        else:
            row.append("not eligible: " + "; ".join(verdict.get("reasons") or []).replace("|", "/"))
        lines.append("| " + " | ".join(row) + " |")
    return lines


# Lines of each program's log tail the Markdown shows for a candidate ruled out (the JSON keeps
# the whole tail the serving role read: serving_health_log_lines).
RULED_OUT_TAIL_LINES = 15


def ruled_out(report: Mapping[str, Any]) -> list[str]:
    """Markdown: each candidate that never came up (roles/tuning/tasks/apply.yml), why, what
    was put back and whether it was re-verified, and the end of each blamed program's log."""
    out = [m for m in report["variants"] if m.get("ruled_out")]
    if not out:
        return []
    lines = ["", "## Candidates ruled out (never came up)", ""]
    for m in out:
        r = m["ruled_out"]
        probe = r.get("put_back_probe") or {}
        if r.get("put_back_errors"):
            back = "could not be put back: " + "; ".join(r["put_back_errors"])
        elif probe.get("passed"):
            back = f"re-verified: healthy, and the probe answered {probe.get('answer', '')!r}"
        else:
            back = f"NOT re-verified: {probe.get('error') or 'its probe did not pass'}"
        lines += [
            f"- **{m.get('variant')}** (deadline {r.get('health_timeout_s', '?')} s): "
            + "; ".join(r.get("errors") or ["it did not come up"]),
            f"  Put back **{r.get('put_back', 'deployed')}**, {back}.",
        ]
        for prog in r.get("programs") or []:
            tail = str(prog.get("log_tail") or "").rstrip("\n").splitlines()[-RULED_OUT_TAIL_LINES:]
            health = prog.get("health") or {}
            seen = health.get("status", health.get("error"))
            lines += [
                "",
                f"  `{prog.get('program')}` on {prog.get('host')}: {prog.get('state')}"
                + (f" ({prog['description']})" if prog.get("description") else "")
                + (f", health {seen}" if seen is not None else "")
                + f"; the last {len(tail)} lines of its log:",
                "",
                "  ```text",
                *[f"  {line}" for line in tail],
                "  ```",
            ]
    return lines


def _settings_text(settings: Mapping[str, Any] | None, workload: Mapping[str, Any]) -> str:
    """The fixed request settings in one line (older measurements did not record them)."""
    if not settings:
        return "Request settings: not recorded (temperature 0 and ignore_eos were fixed then too)."
    thinking = "on" if settings.get("thinking") else "off"
    where = "" if workload.get("api") == "chat" else " (unused: the completions API applies no chat template)"
    return (
        f"Request settings: temperature {settings.get('temperature', 0.0):g}, ignore_eos "
        f"{str(settings.get('ignore_eos', True)).lower()}, chat template thinking {thinking}{where}; "
        f"prompts from the corpus {settings.get('prompt_corpus', '?')}."
    )


def render_markdown(report: Mapping[str, Any]) -> str:
    meta = report.get("metadata") or {}
    verdict = "PASSED" if report["passed"] else "FAILED"
    lines = [
        f"# Validation report: {meta.get('host', 'unknown host')} — {verdict}",
        "",
        f"Generated {report['generated_at']}, appliance commit `{meta.get('appliance_commit', 'unknown')}`, "
        f"running variant **{report['selected_variant']}**.",
        "",
    ]
    if not report["passed"]:
        lines += [f"> {report['failure_message']}", ""]
    lines += [
        "## Gates",
        "",
        "| gate | result | measured | limit | detail |",
        "| --- | --- | --- | --- | --- |",
    ]
    for g in report["gates"]:
        lines.append(
            f"| {g['name']} | {'pass' if g['passed'] else '**FAIL**'} | {_fmt(g['measured'], 2)} | "
            f"{_fmt(g['limit'], 2)} | {g['message']} |"
        )
    lines += _tolerance_lines(report)
    lines += _spread_lines(report)
    lines += engine_choices.markdown(report.get("engine_startup"))
    lines += roofline.markdown(report.get("roofline"))
    targets = report.get("targets") or []
    if targets:
        lines += [
            "",
            "## Distance to the target line (not gated)",
            "",
            "| level | measured tok/s | target tok/s | of target | short by |",
            "| --- | --- | --- | --- | --- |",
        ]
        for t in targets:
            fraction = f"{t['fraction']:.0%}" if t.get("fraction") is not None else "-"
            gap = _fmt(max(t["gap"], 0.0), 1) if t.get("gap") is not None else "-"
            lines.append(
                f"| {t['level']} | {_fmt(t['measured'], 1)} | {_fmt(t['target'], 0)} | {fraction} | {gap} |"
            )
    if len(report["variants"]) > 1:
        selection = report.get("selection") or {}
        lines += ["", "## Variants side by side", ""]
        if selection.get("objective"):
            lines += [
                f"Objective: {selection['objective']}; running now: **{report['selected_variant']}**.",
                "",
            ]
        lines += side_by_side(report)
    lines += search.markdown(report.get("search"))
    lines += ruled_out(report)
    lines += [
        "",
        "## Variants",
        "",
        "Latencies in ms as p50 / p90 / p99. Output tok/s is aggregate (generated tokens / wall time of the "
        "measured phase); per-request tok/s is 1 / TPOT (p50), TPOT excludes the first token.",
        "",
        "| variant | probe | C | requests | errors | output tok/s | per-request tok/s "
        "| TTFT | TPOT | ITL | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in report["variants"]:
        probe = m.get("probe") or {}
        probe_cell = (
            "pass" if probe.get("passed") else f"**FAIL** ({probe.get('error') or repr(probe.get('answer'))})"
        )
        phases = m.get("phases") or []
        if not phases:
            lines.append(f"| {m.get('variant')} | {probe_cell} | - | - | - | - | - | - | - | - | - |")
        for p in phases:
            lines.append(
                f"| {m.get('variant')} | {probe_cell} | {p['concurrency']} | {p['requests']} "
                f"| {p['errors']} | "
                f"{_fmt(p['output_tok_s'], 2)} | {_fmt((p.get('request_tok_s') or {}).get('p50'), 2)} | "
                f"{_pcts(p.get('ttft_ms'))} | {_pcts(p.get('tpot_ms'))} | {_pcts(p.get('itl_ms'))} | "
                f"{_fmt(p['wall_s'], 2)} |"
            )
    overrides = [m for m in report["variants"] if m.get("env_hooks") or m.get("vars") or m.get("description")]
    if overrides:
        lines += ["", "Variants (overrides of serving variables and env hooks, over the inventory):", ""]
        for m in overrides:
            text = overrides_text(m)
            note = f" — {m['description']}" if m.get("description") else ""
            lines.append(f"- **{m.get('variant')}**: `{text or 'no override'}`{note}")
    selection = report.get("selection")
    if selection:
        objective = selection.get("objective") or f"output tok/s at C={selection['concurrency']}"
        lines += [
            "",
            f"Fastest by the objective ({objective}): **{selection['fastest'] or 'none'}**.",
        ]
    workloads = (report["variants"][0].get("workloads") if report["variants"] else None) or []
    if workloads:
        w = workloads[0]
        unit = report["variants"][0].get("input_len_unit", "tokens")
        lines += [
            "",
            "## Workload",
            "",
            f"API `{w['api']}`, input {w['input_len']} {unit}, output {w['output_len']} tokens (ignore_eos), "
            f"request timeout {w['request_timeout_s']:g} s.",
            "",
            _settings_text(report["variants"][0].get("request_settings"), w),
            "",
            "Each level is a closed loop, warmed up (the warm-up count, and with decode /metrics until the "
            "running batch reached the concurrency), then measured in waves until every minimum is met.",
            "",
            "| concurrency | min requests | min waves | min measured s | warm-up requests |",
            "| --- | --- | --- | --- | --- |",
            *[
                f"| {x['concurrency']} | {x['num_requests']} | {x.get('min_waves', 1)} "
                f"| {x.get('min_measure_s', 0):g} | {x['warmup_requests']} |"
                for x in workloads
            ],
        ]
    lines += ["", "## Environment", ""]
    for key in ("host", "target_url", "pd_appliance_version", "appliance_commit"):
        if key in meta:
            lines.append(f"- {key}: `{meta[key]}`")
    for g in meta.get("gpus") or []:
        name = g.get("name") if isinstance(g, Mapping) else g
        index = f"{g.get('index')}: " if isinstance(g, Mapping) and "index" in g else ""
        lines.append(f"- GPU {index}{name}")
    versions = meta.get("versions") or {}
    if versions:
        lines.append("- versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    if meta.get("speculative_decoding"):
        lines.append(f"- speculative decoding (MTP): {meta['speculative_decoding']}")
    for host, rel in sorted((meta.get("release") or {}).items()):
        lines.append(f"- release on {host}: `{rel.get('id')}` ({rel.get('status')}): {rel.get('label')}")
    env_hooks = meta.get("env_hooks") or {}
    if env_hooks:
        lines += [
            "",
            "Env hooks in force:",
            "",
            "```json",
            json.dumps(env_hooks, indent=2, sort_keys=True),
            "```",
        ]
    if report.get("plot_note"):
        lines += ["", f"Plot: {report['plot_note']}"]
    return "\n".join(lines) + "\n"


def spread_whiskers(phases: Sequence[Mapping[str, Any] | None]) -> list[list[float]]:
    """Whiskers from each bar (its output tok/s) down to its waves' p10 and up to their p90.

    matplotlib's `yerr` shape: [below, above], one entry per bar; NaN (no whisker drawn) where a
    level has no spread (not measured, or a report from before steady-state waves).
    """
    below: list[float] = []
    above: list[float] = []
    for phase in phases:
        spread = (phase or {}).get("spread") or {}
        figure, p10, p90 = (phase or {}).get("output_tok_s"), spread.get("p10"), spread.get("p90")
        if figure is None or p10 is None or p90 is None:
            below.append(math.nan)
            above.append(math.nan)
            continue
        below.append(max(0.0, float(figure) - float(p10)))
        above.append(max(0.0, float(p90) - float(figure)))
    return [below, above]


def render_plot(report: Mapping[str, Any], path: Path) -> None:
    """Every variant side by side: output tok/s (with floors and the target line), TPOT and TTFT p50.

    One bar group per variant, one bar per concurrency level, each output tok/s bar with whiskers to
    its waves' p10 and p90; the variant left running is starred, the ones the tuner ruled out are
    hatched.
    """
    # A Figure on the Agg canvas, not pyplot: no backend selection or figure manager to import.
    from matplotlib import rcParams
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    variants = [m for m in report["variants"] if m.get("phases")] or list(report["variants"])
    levels = _levels(report)
    ranking = {r["variant"]: r for r in (report.get("selection") or {}).get("ranking") or []}
    ineligible = [not ranking.get(m.get("variant"), {"eligible": True})["eligible"] for m in variants]
    names = [
        ("* " if m.get("variant") == report["selected_variant"] else "")
        + str(m.get("variant"))
        + ("\n(not eligible)" if out else "")
        for m, out in zip(variants, ineligible, strict=True)
    ]
    fig = Figure(figsize=(max(12.0, 2.0 + 1.6 * len(variants) * 3), 4.8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    ax_tput, ax_tpot, ax_ttft = axes
    width = 0.8 / max(len(levels), 1)
    colours = rcParams["axes.prop_cycle"].by_key()["color"]
    thresholds = {
        1 if k == "bs=1" else int(k.split("=")[1]): v for k, v in (report.get("thresholds") or {}).items()
    }
    targets = {
        1 if t["level"] == "bs=1" else int(t["level"].split("=")[1]): t["target"]
        for t in report.get("targets") or []
    }
    for j, c in enumerate(levels):
        colour = colours[j % len(colours)]
        label = gates.concurrency_label(c)
        xs = [i + j * width for i in range(len(variants))]
        phases = [{int(p["concurrency"]): p for p in m.get("phases") or []}.get(c) for m in variants]
        hatches = ["//" if out else "" for out in ineligible]
        tput = [p["output_tok_s"] if p else 0 for p in phases]
        whiskers = spread_whiskers(phases)
        ax_tput.bar(xs, tput, width, label=label, color=colour, hatch=hatches, yerr=whiskers, capsize=3)
        for ax, key in ((ax_tpot, "tpot_ms"), (ax_ttft, "ttft_ms")):
            ys = [((p or {}).get(key) or {}).get("p50") for p in phases]
            ax.bar(
                xs, [y if y is not None else 0 for y in ys], width, label=label, color=colour, hatch=hatches
            )
        if c in thresholds:
            ax_tput.axhline(thresholds[c], color=colour, linestyle="--", linewidth=1, label=f"{label} floor")
        if c in targets:
            ax_tput.axhline(targets[c], color=colour, linestyle=":", linewidth=1.5, label=f"{label} target")
    centers = [i + (len(levels) - 1) * width / 2 for i in range(len(variants))]
    for ax, title, unit in (
        (ax_tput, "Output throughput\n(--: floor, ..: target; whiskers: waves p10-p90)", "tok/s"),
        (ax_tpot, "TPOT p50", "ms"),
        (ax_ttft, "TTFT p50", "ms"),
    ):
        ax.set_xticks(
            centers,
            names,
            rotation=30 if len(variants) > 2 else 0,
            ha="right" if len(variants) > 2 else "center",
        )
        ax.set(title=title, ylabel=unit)
        ax.legend(fontsize=7)
    verdict = "PASSED" if report["passed"] else "FAILED"
    host = (report.get("metadata") or {}).get("host", "")
    fig.suptitle(f"{host} validation {verdict} (* = running: {report['selected_variant']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_report(
    report: dict[str, Any], out_dir: str | os.PathLike[str], plot: bool = True
) -> dict[str, str | None]:
    """Write report.json, report.md and (when matplotlib imports) report.png into `out_dir`.

    The JSON is written first, so a failure in the plot can never lose the figures. A copy of
    the JSON also goes to runs/<generated_at>.json, keeping earlier reports.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png: Path | None = out / "report.png"
    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            png = None
            report["plot_note"] = (
                "not drawn on the host: matplotlib is missing (pip install 'pd-appliance[plot]')"
            )
    else:
        png = None
        report["plot_note"] = "not drawn (plot disabled)"
    text = json.dumps(report, indent=2, sort_keys=True) + "\n"
    write_atomic(out / "report.json", text, mode=0o600)
    runs = out / "runs"
    runs.mkdir(exist_ok=True)
    write_atomic(runs / f"{report['generated_at'].replace(':', '')}.json", text, mode=0o600)
    write_atomic(out / "report.md", render_markdown(report), mode=0o600)
    if png is not None:
        try:
            render_plot(report, png)
        except Exception as exc:  # the figures are safe on disk; a broken plot must not hide them
            png = None
            report["plot_note"] = f"plot failed: {type(exc).__name__}: {exc}"
            write_atomic(out / "report.md", render_markdown(report), mode=0o600)
    return {
        "json": str(out / "report.json"),
        "markdown": str(out / "report.md"),
        "png": str(png) if png else None,
    }


def write_copy(
    report: dict[str, Any], out_dir: str | os.PathLike[str], plot: bool = True
) -> dict[str, str | None]:
    """The controller's copy of a host's report: report.json and report.md as the host wrote them,
    and report.png drawn here.

    The report arrives in pd_bench_report's result, so the controller needs no fetch (a module run
    per re-run); the host's tools venv has no matplotlib, the controller's has. Without matplotlib
    the copy has no plot and says why in `plot_note` of the paths returned.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "report.json", json.dumps(report, indent=2, sort_keys=True) + "\n", mode=0o600)
    write_atomic(out / "report.md", render_markdown(report), mode=0o600)
    for name in ("report.json", "report.md"):  # as a fetch left them: nothing secret in a report
        (out / name).chmod(0o644)
    paths: dict[str, str | None] = {
        "json": str(out / "report.json"),
        "markdown": str(out / "report.md"),
        "png": None,
    }
    if not plot:
        return paths
    try:
        render_plot(report, out / "report.png")
    except ImportError as exc:
        return {**paths, "plot_note": f"not drawn on the controller: {exc}"}
    return {**paths, "png": str(out / "report.png")}


def accept(report: Mapping[str, Any], history_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Record a passed report as the new baseline for regression checks."""
    if not report["passed"]:
        raise ReportError("only a passed report can be accepted into the history")
    meta = report.get("metadata") or {}
    entry = {
        "accepted_at": report["generated_at"],
        "variant": report["selected_variant"],
        "appliance_commit": meta.get("appliance_commit"),
        "figures": report["figures"],
    }
    history.append(history_path, entry)
    return entry
