"""pd-gpu-exporter on recorded NVML answers: the H200 run replayed, the GPU facts fixture, failures.

The H200 record (fixtures/gpu_exporter_h200_2026-12-03.json) was taken on the lent GPU by
record_gpu_exporter.py while a bf16 matmul loop kept it busy; nvidia-smi's CSV from the same moment
is in the record and is the independent check of units and scales here.
"""

from __future__ import annotations

import csv
import io
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
from nvml_record import FIXTURES, ReplayNvml
from prometheus_client.parser import text_string_to_metric_families

from gpu.fake_nvml import FakeNvml, NVMLError
from pd_appliance.monitoring.gpu_exporter import (
    NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
    Assignment,
    ExporterError,
    GpuCollector,
    main,
    parse_assignments,
    parse_gpu_list,
    scrape_once,
)
from pd_standins import nvml as standin_nvml
from pd_testlib import reserve_ports

H200_RECORD = "gpu_exporter_h200_2026-12-03.json"
H200_LIVE = "gpu_exporter_h200_live_loaded_2026-12-03.txt"


def samples(text: str | bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Parsed exposition: sample name -> [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text.decode() if isinstance(text, bytes) else text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def one(parsed: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    found = [v for lab, v in parsed.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {found} in {sorted(parsed)}"
    return found[0]


# ---- the H200 record, replayed -----------------------------------------------------------------
@pytest.fixture
def h200() -> tuple[ReplayNvml, dict[str, Any]]:
    return ReplayNvml.from_fixture(H200_RECORD)


def test_replayed_h200_scrapes_equal_the_ones_taken_on_the_gpu(h200) -> None:
    nvml, record = h200
    collector = GpuCollector(nvml, parse_assignments(record["assign"]))
    replayed = [scrape_once(collector).decode() for _ in record["scrapes"]]
    # Taken when the label was `simulated="false"`; since issue 25 a stand-in names itself in
    # `stand_in`, empty for NVML itself: that one label is renamed, every other byte is the GPU's.
    taken = [s["text"].replace('simulated="false"', 'stand_in=""') for s in record["scrapes"]]
    assert replayed == taken
    assert not nvml.unanswered


def test_h200_scrape_agrees_with_nvidia_smi(h200) -> None:
    nvml, record = h200
    parsed = samples(scrape_once(GpuCollector(nvml, parse_assignments(record["assign"]))))
    rows = list(csv.DictReader(io.StringIO(record["nvidia_smi_csv"]), skipinitialspace=True))
    assert len(rows) == 1, record["nvidia_smi_csv"]
    smi = rows[0]
    gpu = {"gpu": smi["index"], "role": "decode", "pd_instance": "decode", "stand_in": ""}
    info = [lab for lab, _ in parsed["pd_gpu_info"]]
    assert info == [{**gpu, "uuid": smi["uuid"], "name": smi["name"], "pci_bus_id": smi["pci.bus_id"]}]
    assert one(parsed, "pd_gpu_driver_info", driver_version=smi["driver_version"]) == 1
    assert one(parsed, "pd_gpu_up", **gpu) == 1
    assert one(parsed, "pd_gpu_memory_total_bytes", **gpu) == pytest.approx(
        float(smi["memory.total [MiB]"]) * 2**20, rel=0.01
    )
    assert one(parsed, "pd_gpu_power_limit_watts", **gpu) == pytest.approx(float(smi["power.limit [W]"]))
    # Under the matmul loop both see a busy GPU near its power limit.
    assert one(parsed, "pd_gpu_utilization_ratio", **gpu) >= 0.9 and float(smi["utilization.gpu [%]"]) >= 90
    assert one(parsed, "pd_gpu_power_watts", **gpu) == pytest.approx(float(smi["power.draw [W]"]), rel=0.15)
    assert one(parsed, "pd_gpu_temperature_celsius", **gpu) == pytest.approx(
        float(smi["temperature.gpu"]), abs=5
    )
    assert one(parsed, "pd_gpu_clock_hertz", clock="sm", **gpu) == pytest.approx(
        float(smi["clocks.current.sm [MHz]"]) * 1e6, rel=0.1
    )
    for link, field in (("max", "pcie.link.gen.max"), ("current", "pcie.link.gen.current")):
        assert one(parsed, "pd_gpu_pcie_link_generation", link=link, **gpu) == float(smi[field])
    for link, field in (("max", "pcie.link.width.max"), ("current", "pcie.link.width.current")):
        assert one(parsed, "pd_gpu_pcie_link_width", link=link, **gpu) == float(smi[field])
    # NVML delivered Xid events on the H200 (the event set registered), and none were raised.
    assert one(parsed, "pd_gpu_xid_watch_active", **gpu) == 1
    assert one(parsed, "pd_gpu_xid_events_total", **gpu) == 0
    # At 99% of its power limit the board was held by the software power cap, and said so.
    assert one(parsed, "pd_gpu_clocks_event_reason", reason="sw_power_cap", **gpu) == 1


def test_live_h200_scrape_has_the_families_of_the_replay(h200) -> None:
    """The HTTP server's answer on the H200 carries the same series as the collector's scrape."""
    nvml, record = h200
    replayed = samples(scrape_once(GpuCollector(nvml, parse_assignments(record["assign"]))))
    live = samples((FIXTURES / H200_LIVE).read_text())
    assert set(live) == set(replayed)
    assert {k: len(v) for k, v in live.items()} == {k: len(v) for k, v in replayed.items()}


# ---- the GPU facts fixture (tests/gpu) with the failures a host produces ------------------------
class DynamicFakeNvml(FakeNvml):
    """tests/gpu's recorded H200 facts, plus the exporter's reads: unsupported unless set, Xids queued."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.xids: dict[int, list[int]] = {}
        self.supported: dict[str, Any] = {}

    def _dynamic(self, name: str, h: int) -> Any:
        if name not in self.supported:
            raise NVMLError(3)
        return self.supported[name]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return self._dynamic("nvmlDeviceGetMemoryInfo", h)  # the facts record has the total only

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter: int) -> int:
        """The record has the uncorrected volatile count (what the facts read); the rest is unsupported."""
        if (error_type, counter) == (1, 0):
            return super().nvmlDeviceGetTotalEccErrors(h, error_type, counter)
        raise NVMLError(3)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvmlDeviceGet"):
            return lambda h, *args: self._dynamic(name, h)
        raise AttributeError(name)

    def nvmlEventSetCreate(self) -> dict[str, int]:
        return {}

    def nvmlDeviceRegisterEvents(self, h: int, types: int, event_set: dict[str, int]) -> None:
        event_set["gpu"] = h

    def nvmlEventSetWait_v2(self, event_set: dict[str, int], timeout_ms: int) -> Any:
        queue = self.xids.get(event_set["gpu"], [])
        if not queue:
            raise NVMLError(10)
        return type("Event", (), {"eventType": NVML_EVENT_TYPE_XID_CRITICAL_ERROR, "eventData": queue.pop(0)})


def test_facts_fixture_exports_what_it_knows_and_leaves_out_what_it_does_not() -> None:
    nvml = DynamicFakeNvml.recorded()
    parsed = samples(scrape_once(GpuCollector(nvml, {0: Assignment("prefill", "prefill")})))
    gpu = {"gpu": "0", "role": "prefill", "pd_instance": "prefill", "stand_in": ""}
    device = nvml.devices[0]
    assert one(parsed, "pd_gpu_up", **gpu) == 1
    assert one(parsed, "pd_gpu_pcie_link_generation", link="max", **gpu) == device["max_pcie_link_generation"]
    assert one(parsed, "pd_gpu_pcie_link_width", link="current", **gpu) == device["curr_pcie_link_width"]
    ecc = device["ecc_uncorrected_volatile"]["value"]
    assert one(parsed, "pd_gpu_ecc_errors_total", error="uncorrected", counter="volatile", **gpu) == ecc
    # Readings the board does not support are absent, not zero, and not counted as errors.
    assert "pd_gpu_power_watts" not in parsed and "pd_gpu_utilization_ratio" not in parsed
    assert one(parsed, "pd_gpu_nvml_read_errors_total", **gpu) == 0


def test_a_lost_gpu_is_down_and_the_others_stay_up() -> None:
    record = FakeNvml.recorded().record
    record = {**record, "devices": record["devices"] * 3}
    nvml = DynamicFakeNvml(record, lost=1)
    parsed = samples(scrape_once(GpuCollector(nvml, parse_assignments(["decode=0-2"]))))
    assert [v for _, v in sorted(parsed["pd_gpu_up"], key=lambda s: s[0]["gpu"])] == [1, 0, 1]
    assert one(parsed, "pd_gpu_expected_count") == 3


def test_a_driver_that_does_not_load_is_reported_and_retried() -> None:
    nvml = DynamicFakeNvml.recorded(init_error=9)
    collector = GpuCollector(nvml, parse_assignments(["decode=0"]))
    parsed = samples(scrape_once(collector))
    assert one(parsed, "pd_gpu_nvml_up") == 0
    assert "pd_gpu_up" not in parsed
    nvml.init_error = None
    assert one(samples(scrape_once(collector)), "pd_gpu_nvml_up") == 1


def test_xid_events_are_counted_per_gpu_and_code() -> None:
    nvml = DynamicFakeNvml.recorded()
    collector = GpuCollector(nvml, parse_assignments(["decode=0"]))
    parsed = samples(scrape_once(collector))
    assert one(parsed, "pd_gpu_xid_events_total", gpu="0") == 0
    assert "pd_gpu_xid_errors_total" not in parsed
    nvml.xids[0] = [79, 48, 79]
    parsed = samples(scrape_once(collector))
    assert one(parsed, "pd_gpu_xid_events_total", gpu="0") == 3
    assert one(parsed, "pd_gpu_xid_errors_total", gpu="0", xid="79") == 2
    assert one(parsed, "pd_gpu_xid_errors_total", gpu="0", xid="48") == 1


# ---- command line --------------------------------------------------------------------------------
def test_assignments_parse_roles_instances_and_ranges() -> None:
    assert parse_gpu_list("0-2,5") == [0, 1, 2, 5]
    owners = parse_assignments(["prefill=0-1", "decode:decode-1=2,3"])
    assert owners == {
        0: Assignment("prefill", "prefill"),
        1: Assignment("prefill", "prefill"),
        2: Assignment("decode", "decode-1"),
        3: Assignment("decode", "decode-1"),
    }


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["decode"], "expected ROLE[:INSTANCE]=GPUS"),
        (["decode=4-2"], "runs backwards"),
        (["decode=x"], "is not an index"),
        (["prefill=0-3", "decode=3-4"], "GPU 3 is already assigned to prefill:prefill"),
    ],
)
def test_bad_assignments_are_refused_with_the_reason(specs: list[str], message: str) -> None:
    with pytest.raises(ExporterError, match=re.escape(message)):
        parse_assignments(specs)


def test_cli_refuses_a_bad_assignment(capsys) -> None:
    assert main(["--once", "--nvml-module", "pd_standins.nvml", "--assign", "decode"]) == 2
    assert "--assign 'decode'" in capsys.readouterr().err


def test_cli_names_a_missing_nvml_module(capsys) -> None:
    assert main(["--once", "--nvml-module", "no_such_nvml"]) == 2
    assert "install nvidia-ml-py" in capsys.readouterr().err


def test_simulated_gpus_are_read_through_the_same_collector_and_labelled(capsys, monkeypatch) -> None:
    monkeypatch.setenv("PD_SIM_GPUS", "8")
    assert (
        main(
            [
                "--once",
                "--nvml-module",
                "pd_standins.nvml",
                "--assign",
                "prefill=0-3",
                "--assign",
                "decode=4-7",
            ]
        )
        == 0
    )
    parsed = samples(capsys.readouterr().out)
    every = [lab for series in parsed.values() for lab, _ in series]
    assert every and all(lab.get("stand_in") == standin_nvml.STAND_IN for lab in every)
    roles = {lab["gpu"]: lab["role"] for lab, _ in parsed["pd_gpu_up"]}
    assert roles == {str(i): "prefill" if i < 4 else "decode" for i in range(8)}
    assert one(parsed, "pd_gpu_expected_count") == 8


def test_exporter_serves_http_and_stops_on_sigterm() -> None:
    port = reserve_ports(1)[0]
    env = {**os.environ, "PD_SIM_GPUS": "2"}
    argv = [sys.executable, "-m", "pd_appliance.monitoring.gpu_exporter", "--port", str(port),
            "--nvml-module", "pd_standins.nvml", "--assign", "decode=0-1"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline, body = time.monotonic() + 30, ""
        while time.monotonic() < deadline and not body:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    body = r.read().decode()
            except OSError:
                time.sleep(0.2)
        assert len(samples(body)["pd_gpu_up"]) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
