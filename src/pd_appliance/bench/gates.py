"""Pass/fail decisions: the probe, failed requests, throughput floors and regressions.

Every gate carries the measured value and the limit it was compared with, so the message that
fails a play says exactly how far off the deployment is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pd_appliance.bench.steady import relative_spread


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
            found: Mapping[str, Any] = phase
            return found
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


@dataclass(frozen=True)
class Tolerance:
    """The regression tolerance applied at one level, and where it came from."""

    applied: float
    configured: float
    spread: float | None
    waves: int

    @property
    def source(self) -> str:
        return "spread" if self.spread is not None and self.spread > self.configured else "configured"

    def text(self) -> str:
        """Which tolerance applied and why, e.g. "tolerance 20.0%: the waves' (p50-p10)/p50 of 6
        waves, wider than the configured 10.0%"."""
        if self.spread is None:
            return f"tolerance {self.applied:.1%}: the configured one (no wave spread measured)"
        spread = f"the waves' (p50-p10)/p50 of {self.waves} waves"
        if self.source == "spread":
            return f"tolerance {self.applied:.1%}: {spread}, wider than the configured {self.configured:.1%}"
        return f"tolerance {self.applied:.1%}: the configured one ({spread} is {self.spread:.1%})"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "source": self.source}


def effective_tolerance(configured: float, phase: Mapping[str, Any] | None) -> Tolerance:
    """max(configured tolerance, the level's relative spread): a gate never tighter than the noise.

    The spread is steady.relative_spread, (p50 - p10) / p50 of the per-wave output tok/s: how far
    below its median one wave in ten falls, in the tolerance's own unit (a fraction below). A
    tolerance tighter than that fails a healthy deployment on noise alone, one run in a few. It
    widens both figures of the level (aggregate and per-request), whose noise has the same source.
    """
    phase_spread = (phase or {}).get("spread")
    spread = relative_spread(phase_spread)
    waves = int((phase_spread or {}).get("waves") or 0)
    applied = max(configured, spread) if spread is not None else configured
    return Tolerance(applied, configured, spread, waves)


def regression_tolerances(measurement: Mapping[str, Any], tolerance: float | None) -> dict[str, Tolerance]:
    """The tolerance applied at each measured level (empty without a configured tolerance)."""
    if tolerance is None:
        return {}
    return {
        concurrency_label(int(p["concurrency"])): effective_tolerance(tolerance, p)
        for p in measurement.get("phases") or []
    }


def regression_gates(
    measurement: Mapping[str, Any], last_accepted: Mapping[str, Any] | None, tolerance: float | None
) -> list[Gate]:
    """Fail every figure that dropped more than its level's effective tolerance below the last
    accepted run: `tolerance` (a fraction), widened to the level's measured spread where that is
    larger (effective_tolerance)."""
    if tolerance is None or last_accepted is None:
        return []
    baseline = last_accepted.get("figures") or {}
    tolerances = regression_tolerances(measurement, tolerance)
    gates: list[Gate] = []
    for name, measured in regression_figures(measurement).items():
        if name not in baseline:
            continue
        level = tolerances.get(name.split(" ", 1)[0]) or Tolerance(tolerance, tolerance, None, 0)
        floor = float(baseline[name]) * (1.0 - level.applied)
        ok = measured >= floor
        gates.append(
            Gate(
                f"regression: {name}",
                ok,
                f"{name} {measured:.2f} {'>=' if ok else '<'} {floor:.2f} "
                f"(last accepted {float(baseline[name]):.2f} at {last_accepted.get('accepted_at', '?')}, "
                f"{level.text()})",
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
