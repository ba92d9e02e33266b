"""Proof records (pd_appliance.proofs): a proof is skipped only when its recorded inputs' digest is
today's, it runs on any change, a missing or foreign record, or when forced; and the filters the
roles call read a record the way the host's slurp hands it over."""

from __future__ import annotations

import base64
import datetime as dt
import importlib.util
import json
from pathlib import Path

import pytest

from pd_appliance import cli, proofs

ROOT = Path(__file__).resolve().parents[2]


def load_filters():
    spec = importlib.util.spec_from_file_location("pd_proofs_filter", ROOT / "plugins/filter/pd_proofs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


def test_digest_ignores_key_order_and_sees_every_value():
    a = proofs.digest({"lock": "x==1", "python": "3.11", "index_urls": ["https://pypi.org/simple"]})
    b = proofs.digest({"python": "3.11", "index_urls": ["https://pypi.org/simple"], "lock": "x==1"})
    assert a == b
    assert a != proofs.digest({"lock": "x==1", "python": "3.12", "index_urls": ["https://pypi.org/simple"]})
    assert a != proofs.digest({"lock": "x==2", "python": "3.11", "index_urls": ["https://pypi.org/simple"]})


def test_tree_digest_sees_edits_additions_and_renames_but_not_bytecode(tmp_path: Path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("A = 1\n")
    first = proofs.tree_digest([pkg])
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0bytecode")
    assert proofs.tree_digest([pkg]) == first
    (pkg / "a.py").write_text("A = 2\n")
    edited = proofs.tree_digest([pkg])
    assert edited != first
    (pkg / "b.py").write_text("")
    assert proofs.tree_digest([pkg]) != edited
    (pkg / "b.py").rename(pkg / "c.py")
    assert proofs.tree_digest([pkg]) != edited


def record_text(name: str, digest: str) -> str:
    return proofs.new_record(
        name, digest, {"ok": True}, now=dt.datetime(2026, 12, 3, 20, 0, tzinfo=dt.timezone.utc)
    ).to_json()


def test_unchanged_inputs_skip_and_say_what_why_and_how_to_force():
    digest = proofs.digest({"lock": "x==1"})
    decision = proofs.decide("lock proof", record_text("lock proof", digest), digest)
    assert decision["run"] is False
    assert decision["result"] == {"ok": True}
    line = decision["line"]
    assert line.startswith(proofs.SKIP_PREFIX + ": lock proof: ")
    assert "inputs unchanged since 2026-12-03T20:00:00Z" in line
    assert digest[:12] in line
    assert "--force-checks" in line


@pytest.mark.parametrize(
    ("record", "force", "reason"),
    [
        (None, False, "no proof recorded"),
        ("", False, "no proof recorded"),
        ("{not json", False, "no proof recorded"),
        (
            json.dumps({"name": "lock proof", "digest": "d", "proven_at": "t", "version": 0}),
            False,
            "no proof recorded",
        ),
        ("OTHER", False, "inputs changed since 2026-12-03T20:00:00Z"),
        ("SAME", True, "forced (appliance_force_checks)"),
    ],
)
def test_a_proof_runs_unless_its_record_matches(record, force, reason):
    digest = proofs.digest({"lock": "x==1"})
    if record == "SAME":
        record = record_text("lock proof", digest)
    elif record == "OTHER":
        record = record_text("lock proof", proofs.digest({"lock": "x==2"}))
    decision = proofs.decide("lock proof", record, digest, force=force)
    assert decision["run"] is True
    assert decision["reason"] == reason
    assert decision["line"] == ""


def test_another_proofs_record_is_not_this_one():
    digest = proofs.digest({"same": "inputs"})
    assert proofs.decide("NIXL check", record_text("lock proof", digest), digest)["run"] is True


def test_filters_read_the_hosts_slurp_and_write_a_record_they_accept():
    filters = load_filters()
    digest = filters["pd_proof_digest"]({"argv": ["--size-mib", "256"]})
    text = filters["pd_proof_record"]({"ok": True, "memory": "DRAM"}, "NIXL check", digest)
    slurped = {"content": base64.b64encode(text.encode()).decode(), "encoding": "base64"}
    skip = filters["pd_proof_decide"](slurped, "NIXL check", digest, False)
    assert (skip["run"], skip["result"]) == (False, {"ok": True, "memory": "DRAM"})
    # a failed slurp (no record on the host) and a forced run both run the proof
    assert filters["pd_proof_decide"]({"failed": True, "msg": "file not found"}, "NIXL check", digest, False)[
        "run"
    ]
    assert filters["pd_proof_decide"](slurped, "NIXL check", digest, True)["run"]
    # `-e appliance_force_checks=false` is the string "false": it must not force
    assert not filters["pd_proof_decide"](slurped, "NIXL check", digest, "false")["run"]
    assert filters["pd_proof_decide"](slurped, "NIXL check", digest, "true")["run"]


def test_run_summary_lists_the_skipped_proofs(tmp_path: Path):
    line = proofs.decide("lock proof", record_text("lock proof", "d" * 64), "d" * 64)["line"]
    events = [
        {
            "event": "runner_on_ok",
            "event_data": {"host": "node1", "task": "Say which proof is skipped", "res": {"msg": line}},
        },
        {
            "event": "runner_on_ok",
            "event_data": {"host": "node1", "task": "other", "res": {"msg": "PROOF of nothing"}},
        },
    ]
    summary = cli.summarize_events(events)
    assert summary.skipped_proofs == ["node1: " + line[len(proofs.SKIP_PREFIX) + 2 :]]
    screen = cli.render_summary(summary, tmp_path / "run")
    assert "skipped proofs (inputs unchanged; --force-checks runs them):" in screen
    assert "node1: lock proof: inputs unchanged since 2026-12-03T20:00:00Z" in screen


def test_force_checks_switch_sets_the_variable():
    forced = cli.run_variables(cli.build_parser().parse_args(["deploy", "--force-checks", "-e", "a=1"]))
    assert forced == {"a": "1", "appliance_force_checks": True}
    assert "appliance_force_checks" not in cli.run_variables(cli.build_parser().parse_args(["deploy"]))
