"""Pass/fail decisions: the probe, failed requests, throughput floors and regressions.

Every gate carries the measured value and the limit it was compared with, so the message that
fails a play says exactly how far off the deployment is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Gate:
    name: str
    passed: bool
    message: str
    measured: float | None = None
    limit: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def concurrency_label(concurrency: int) -> str:
    return "bs=1" if concurrency == 1 else f"C={concurrency}"


def regression_figures(measurement: Mapping[str, Any]) -> dict[str, float]:
    """The figures a regression check compares: aggregate and per-request tok/s per concurrency."""
    figures: dict[str, float] = {}
    for phase in measurement.get("phases") or []:
        label = concurrency_label(int(phase["concurrency"]))
        figures[f"{label} output tok/s"] = float(phase["output_tok_s"])
        per_request = (phase.get("request_tok_s") or {}).get("p50")
        if per_request is not None:
            figures[f"{label} per-request decode tok/s p50"] = float(per_request)
    return figures


def _phase(measurement: Mapping[str, Any], concurrency: int) -> Mapping[str, Any] | None:
    for phase in measurement.get("phases") or []:
        if int(phase["concurrency"]) == concurrency:
            return phase
    return None


def throughput_gates(
    measurement: Mapping[str, Any], thresholds: Mapping[int, float], max_error_rate: float = 0.0
) -> list[Gate]:
    """Probe, error and floor gates for one variant's measurement.

    `thresholds` maps a concurrency to its minimum output tok/s. A concurrency with a threshold
    that was not measured fails: a gate that silently did not run would pass a broken deploy.
    """
    gates: list[Gate] = []
    probe = measurement.get("probe") or {}
    if probe.get("passed"):
        gates.append(Gate("correctness probe", True, f"probe answered {probe.get('answer', '')!r}"))
    else:
        detail = probe.get("error") or f"answer {probe.get('answer', '')!r} lacks {probe.get('expected')!r}"
        gates.append(Gate("correctness probe", False, f"correctness probe failed: {detail}"))
    for concurrency, threshold in sorted(thresholds.items()):
        label = concurrency_label(concurrency)
        phase = _phase(measurement, concurrency)
        if phase is None:
            reason = "the probe failed" if not probe.get("passed") else "it is not in the concurrency list"
            gates.append(
                Gate(f"{label} output tok/s", False, f"{label} not measured ({reason})", None, threshold)
            )
            continue
        requests = int(phase["requests"])
        errors = int(phase["errors"])
        rate = errors / requests if requests else 1.0
        samples = "; ".join(phase.get("error_samples") or [])
        gates.append(
            Gate(
                f"{label} failed requests",
                rate <= max_error_rate,
                f"{label}: {errors} of {requests} requests failed" + (f" ({samples})" if samples else ""),
                float(errors),
                max_error_rate * requests,
            )
        )
        measured = float(phase["output_tok_s"])
        ok = measured >= threshold
        gates.append(
            Gate(
                f"{label} output tok/s",
                ok,
                f"{label} output throughput {measured:.2f} tok/s "
                f"{'>=' if ok else '<'} threshold {threshold:.2f} tok/s",
                measured,
                threshold,
            )
        )
    return gates


def decode_concurrency_gates(measurement: Mapping[str, Any], levels: Sequence[int]) -> list[Gate]:
    """At each level in `levels`, the decode workers ran as many requests at once as were asked for.

    Read from the running-requests gauge sampled while the level was measured (decode_running). A
    level measured without samples fails: then nobody knows which concurrency the figure is for.
    """
    gates: list[Gate] = []
    for concurrency in sorted(levels):
        phase = _phase(measurement, concurrency)
        if phase is None:
            continue  # the throughput gate of that level already fails, saying why
        label = concurrency_label(concurrency)
        running = phase.get("decode_running")
        name = f"{label} decode concurrency"
        if not running:
            message = (
                f"{label}: decode concurrency not checked: no decode worker /metrics URL was sampled "
                "(validation_decode_metrics_urls)"
            )
            gates.append(Gate(name, False, message, None, float(concurrency)))
            continue
        peak = running.get("peak")
        where = ", ".join(running.get("urls") or [])
        if peak is None:
            errors = "; ".join(running.get("errors") or []) or "no sample"
            message = f"{label}: could not read {running.get('metric')} from {where} ({errors})"
            gates.append(Gate(name, False, message, None, float(concurrency)))
            continue
        ok = float(peak) >= concurrency
        message = (
            f"{label}: decode ran at most {peak:g} requests at once ({running.get('metric')}, "
            f"{running.get('samples')} samples on {where}) "
            + (
                f">= {concurrency} asked"
                if ok
                else f"< {concurrency} asked: the figure is not a C={concurrency} figure; the KV pool "
                "(serving_mem_fraction_static, serving_context_length) or --max-running-requests "
                "(serving_max_running_requests) caps running requests at decode"
            )
        )
        gates.append(Gate(name, ok, message, float(peak), float(concurrency)))
    return gates


def target_distances(measurement: Mapping[str, Any], targets: Mapping[int, float]) -> list[dict[str, Any]]:
    """Where each level stands against the target line (reported, never gated)."""
    out: list[dict[str, Any]] = []
    for concurrency, target in sorted(targets.items()):
        label = concurrency_label(concurrency)
        phase = _phase(measurement, concurrency)
        measured = float(phase["output_tok_s"]) if phase is not None else None
        entry: dict[str, Any] = {"level": label, "target": float(target), "measured": measured}
        if measured is None:
            entry.update(fraction=None, gap=None, message=f"{label}: target {target:g} tok/s, not measured")
        else:
            fraction = measured / float(target) if target else None
            gap = float(target) - measured
            entry.update(
                fraction=fraction,
                gap=gap,
                message=(
                    f"{label}: {measured:.1f} tok/s is {fraction:.0%} of the target {target:g} tok/s "
                    + (f"({gap:.1f} tok/s short)" if gap > 0 else "(target reached)")
                ),
            )
        out.append(entry)
    return out


def regression_gates(
    measurement: Mapping[str, Any], last_accepted: Mapping[str, Any] | None, tolerance: float | None
) -> list[Gate]:
    """Fail every figure that dropped more than `tolerance` (a fraction) below the last accepted run."""
    if tolerance is None or last_accepted is None:
        return []
    baseline = last_accepted.get("figures") or {}
    gates: list[Gate] = []
    for name, measured in regression_figures(measurement).items():
        if name not in baseline:
            continue
        floor = float(baseline[name]) * (1.0 - tolerance)
        ok = measured >= floor
        gates.append(
            Gate(
                f"regression: {name}",
                ok,
                f"{name} {measured:.2f} {'>=' if ok else '<'} {floor:.2f} "
                f"(last accepted {float(baseline[name]):.2f} at {last_accepted.get('accepted_at', '?')}, "
                f"tolerance {tolerance:.0%})",
                measured,
                floor,
            )
        )
    return gates


def all_passed(gates: Sequence[Gate]) -> bool:
    return all(g.passed for g in gates)


def failure_message(gates: Sequence[Gate], variant: str) -> str:
    failed = [g.message for g in gates if not g.passed]
    if not failed:
        return ""
    summary = [
        g.message for g in gates if g.measured is not None and g.limit is not None and "tok/s" in g.name
    ]
    return (
        f"validation failed for variant '{variant}': "
        + "; ".join(failed)
        + (" | all throughput gates: " + "; ".join(summary) if summary else "")
    )
