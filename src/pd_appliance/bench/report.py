"""The validation report: gates over the running variant, every variant side by side.

JSON holds every figure (the machine-readable record); Markdown is what a person reads; the
PNG plots throughput and latency percentiles per concurrency. matplotlib is imported only when
the plot is drawn, so a host without it still gets the JSON and the Markdown.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pd_appliance
from pd_appliance.bench import SCHEMA_VERSION, gates, history


class ReportError(ValueError):
    """The inputs of a report do not fit together; the message says which."""


def select_fastest(measurements: Sequence[Mapping[str, Any]], concurrency: int) -> dict[str, Any]:
    """Rank the variants that passed the probe and had no failed request at `concurrency`."""
    ranking: list[dict[str, Any]] = []
    for m in measurements:
        phase = next((p for p in m.get("phases") or [] if int(p["concurrency"]) == concurrency), None)
        eligible = (
            bool((m.get("probe") or {}).get("passed")) and phase is not None and int(phase["errors"]) == 0
        )
        ranking.append(
            {
                "variant": m.get("variant"),
                "eligible": eligible,
                "output_tok_s": float(phase["output_tok_s"]) if phase else None,
            }
        )
    candidates = [r for r in ranking if r["eligible"]]
    fastest = max(candidates, key=lambda r: r["output_tok_s"])["variant"] if candidates else None
    ranking.sort(key=lambda r: (not r["eligible"], -(r["output_tok_s"] or 0.0)))
    return {"concurrency": concurrency, "fastest": fastest, "ranking": ranking}


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
) -> dict[str, Any]:
    """Gate the selected (running) variant and assemble the full report.

    `error` is why nothing was measured (used when `measurements` is empty); `history_error` is
    why the regression baseline could not be read; either fails the report. `final_probe` is the
    probe run after switching to the selected variant at the end of an A/B: it must pass too.
    """
    if not measurements:
        # The measurement itself broke (the play passes its error in): report that, gated as failed.
        measurements = [
            {"variant": selected_variant, "probe": {"passed": False, "error": error or "not measured"}}
        ]
    by_name = {m.get("variant"): m for m in measurements}
    if selected_variant not in by_name:
        raise ReportError(
            f"selected variant {selected_variant!r} is not among the measured {sorted(by_name)}"
        )
    selected = by_name[selected_variant]
    gate_list = gates.throughput_gates(selected, thresholds, max_error_rate)
    if final_probe is not None:
        ok = bool(final_probe.get("passed"))
        detail = final_probe.get("error") or f"answer {final_probe.get('answer', '')!r}"
        gate = gates.Gate("final probe", ok, f"probe after switching to '{selected_variant}': {detail}")
        gate_list.append(gate)
    if history_error:
        gate_list.append(gates.Gate("regression history", False, f"history unreadable: {history_error}"))
    gate_list += gates.regression_gates(selected, last_accepted, regression_tolerance)
    per_variant = {
        name: gates.all_passed(gates.throughput_gates(m, thresholds, max_error_rate))
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
        "max_error_rate": max_error_rate,
        "regression_tolerance": regression_tolerance,
        "last_accepted": dict(last_accepted) if last_accepted else None,
        "gates": [g.as_dict() for g in gate_list],
        "variants_passing_floors": per_variant,
        "selection": dict(selection) if selection else None,
        "final_probe": dict(final_probe) if final_probe is not None else None,
        "figures": gates.regression_figures(selected),
        "metadata": {"pd_appliance_version": pd_appliance.__version__, **dict(metadata or {})},
        "variants": [dict(m) for m in measurements],
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
    overrides = [m for m in report["variants"] if m.get("env_hooks")]
    if overrides:
        lines += ["", "Variant env-hook overrides (merged over the deployed hooks):", ""]
        for m in overrides:
            hooks = json.dumps(m["env_hooks"], sort_keys=True)
            note = f" — {m['description']}" if m.get("description") else ""
            lines.append(f"- **{m.get('variant')}**: `{hooks}`{note}")
    selection = report.get("selection")
    if selection:
        lines += [
            "",
            f"Fastest at C={selection['concurrency']} among variants that passed the probe: "
            f"**{selection['fastest'] or 'none'}**.",
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
            "| concurrency | requests | warm-up requests |",
            "| --- | --- | --- |",
            *[f"| {x['concurrency']} | {x['num_requests']} | {x['warmup_requests']} |" for x in workloads],
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


def render_plot(report: Mapping[str, Any], path: Path) -> None:
    """Throughput per concurrency (one bar group per variant) and TTFT/TPOT percentiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tput, ax_ttft, ax_tpot) = plt.subplots(1, 3, figsize=(15, 4.5))
    variants = [m for m in report["variants"] if m.get("phases")]
    levels = sorted({int(p["concurrency"]) for m in variants for p in m["phases"]})
    width = 0.8 / max(len(variants), 1)
    for i, m in enumerate(variants):
        values = {int(p["concurrency"]): p for p in m["phases"]}
        xs = [j + i * width for j in range(len(levels))]
        ax_tput.bar(
            xs, [values[c]["output_tok_s"] if c in values else 0 for c in levels], width, label=m["variant"]
        )
        for ax, key in ((ax_ttft, "ttft_ms"), (ax_tpot, "tpot_ms")):
            for q, style in (("p50", "-o"), ("p90", "--s"), ("p99", ":^")):
                ys = [(values[c].get(key) or {}).get(q) if c in values else None for c in levels]
                ax.plot(
                    levels,
                    [y if y is not None else float("nan") for y in ys],
                    style,
                    label=f"{m['variant']} {q}",
                )
    centers = [j + (len(variants) - 1) * width / 2 for j in range(len(levels))]
    for label, limit in (report.get("thresholds") or {}).items():
        concurrency = 1 if label == "bs=1" else int(label.split("=")[1])
        if concurrency in levels:
            center = centers[levels.index(concurrency)]
            ax_tput.hlines(limit, center - 0.45, center + 0.45, colors="red", linestyles="dashed")
    ax_tput.set_xticks(centers, [str(c) for c in levels])
    ax_tput.set(title="Output throughput (red: threshold)", xlabel="concurrency", ylabel="tok/s")
    ax_ttft.set(title="TTFT", xlabel="concurrency", ylabel="ms", xscale="log")
    ax_tpot.set(title="TPOT", xlabel="concurrency", ylabel="ms", xscale="log")
    for ax in (ax_ttft, ax_tpot):
        ax.set_xticks(levels, [str(c) for c in levels])
    for ax in (ax_tput, ax_ttft, ax_tpot):
        ax.legend(fontsize=7)
    verdict = "PASSED" if report["passed"] else "FAILED"
    fig.suptitle(f"{(report.get('metadata') or {}).get('host', '')} validation {verdict}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


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
    _atomic_write(out / "report.json", text)
    runs = out / "runs"
    runs.mkdir(exist_ok=True)
    _atomic_write(runs / f"{report['generated_at'].replace(':', '')}.json", text)
    _atomic_write(out / "report.md", render_markdown(report))
    if png is not None:
        try:
            render_plot(report, png)
        except Exception as exc:  # the figures are safe on disk; a broken plot must not hide them
            png = None
            report["plot_note"] = f"plot failed: {type(exc).__name__}: {exc}"
            _atomic_write(out / "report.md", render_markdown(report))
    return {
        "json": str(out / "report.json"),
        "markdown": str(out / "report.md"),
        "png": str(png) if png else None,
    }


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
