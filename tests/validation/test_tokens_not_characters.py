"""README ("Validation: what the gates mean"): prompt lengths are tokens of the checkpoint's
tokenizer.json; validation fails rather than measure characters.

The gate's measurement (pd_bench -> pd_appliance.bench.runner.measure) is given a tokenizer that
cannot be used: a missing file, or no `tokenizers` library. It must raise before any request is sent
(the URL here answers nothing), and the validation role must ask for that (validation_tokenizer_required
true, passed to pd_bench as tokenizer_required).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import yaml

from pd_appliance.bench.runner import measure, plan_from_lists
from pd_appliance.bench.workload import WorkloadError, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
NOWHERE = "http://127.0.0.1:9"  # discard port: nothing is ever measured here


def _plan(tokenizer: str, required: bool = True):
    return plan_from_lists(NOWHERE, [1], [1], 16, 4, tokenizer=tokenizer, tokenizer_required=required)


def test_a_missing_tokenizer_fails_the_measurement(tmp_path: Path) -> None:
    missing = tmp_path / "model" / "tokenizer.json"
    with pytest.raises(WorkloadError, match=r"tokenizer .*tokenizer.json does not exist"):
        asyncio.run(measure(_plan(str(missing))))
    # Only an explicit opt-out measures characters, and then the report says so.
    assert load_tokenizer(str(missing), required=False) is None


def test_no_tokenizers_library_fails_the_measurement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    with pytest.raises(WorkloadError, match="'tokenizers' package is missing"):
        asyncio.run(measure(_plan(str(tokenizer))))


def test_the_validation_role_requires_the_tokenizer() -> None:
    defaults = yaml.safe_load((ROOT / "roles/validation/defaults/main.yml").read_text())
    assert defaults["validation_tokenizer_required"] is True
    assert defaults["validation_tokenizer"] == "{{ appliance_model_dir }}/tokenizer.json"
    # The deployed configuration's measurement is the role's one pd_bench call (bench.yml).
    measure = yaml.safe_load((ROOT / "roles/validation/tasks/measure.yml").read_text())
    deployed = next(t for t in measure if t.get("name") == "Probe and measure the deployed configuration")
    assert deployed["ansible.builtin.include_tasks"] == "bench.yml"
    assert deployed["vars"]["__validation_bench_variant"] == "deployed"
    bench = [
        t for t in yaml.safe_load((ROOT / "roles/validation/tasks/bench.yml").read_text()) if "pd_bench" in t
    ]
    assert len(bench) == 1
    assert bench[0]["pd_bench"]["tokenizer_required"] == "{{ validation_tokenizer_required }}"
    assert (
        bench[0]["pd_bench"]["tokenizer"]
        == "{{ validation_tokenizer_in_use | default(validation_tokenizer) }}"
    )
