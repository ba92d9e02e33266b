"""Helpers of the monitoring tests: the SGLang wheel's metric definitions, exposition parsing."""

from __future__ import annotations

import ast
import importlib.util
import zipfile
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR = "sglang/srt/observability/metrics_collector.py"
PROM_CLASSES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary"}


def find_sglang_wheel() -> Path | None:
    """The pinned wheel, looked up the way tests/sglang does (PD_SGLANG_WHEEL, PD_WHEEL_DIR, ...)."""
    spec = importlib.util.spec_from_file_location(
        "sglang_testlib", ROOT / "tests" / "sglang" / "sglang_testlib.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.find_sglang_wheel()


@dataclass(frozen=True)
class WheelMetric:
    kind: str
    extra_labels: frozenset[str]
    buckets: tuple[float, ...] | None


def wheel_metrics(wheel: Path) -> dict[str, WheelMetric]:
    """Every metric SGLang's collectors define: name -> kind, literal extra labels, literal buckets."""
    with zipfile.ZipFile(wheel) as z:
        tree = ast.parse(z.read(COLLECTOR).decode())
    found: dict[str, WheelMetric] = {}
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PROM_CLASSES
        ):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        name = kw.get("name")
        if not (isinstance(name, ast.Constant) and str(name.value).startswith("sglang:")):
            continue
        labels = kw.get("labelnames")
        extra = frozenset(
            n.value for n in ast.walk(labels) if isinstance(n, ast.Constant) and isinstance(n.value, str)
        ) if labels is not None else frozenset()  # fmt: skip
        buckets = kw.get("buckets")
        literal = None
        if isinstance(buckets, (ast.Tuple, ast.List)) and all(
            isinstance(e, ast.Constant) for e in buckets.elts
        ):
            literal = tuple(float(e.value) for e in buckets.elts)  # type: ignore[attr-defined]
        found[str(name.value)] = WheelMetric(PROM_CLASSES[node.func.id], extra, literal)
    return found


Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_samples(text: str | bytes) -> Samples:
    """Exposition text -> sample name -> [(labels, value)]."""
    out: Samples = {}
    for family in text_string_to_metric_families(text.decode() if isinstance(text, bytes) else text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of `name` whose labels include `labels`."""
    found = [v for lab, v in samples.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]
