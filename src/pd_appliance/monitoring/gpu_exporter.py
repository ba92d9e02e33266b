"""pd-gpu-exporter: GPU health and load for Prometheus, one series per GPU, labelled with its PD role.

    pd-gpu-exporter --listen-address 127.0.0.1 --port 9835 \
        --assign prefill:prefill=0-3 --assign decode:decode=4-7
    pd-gpu-exporter --once ...          # print one scrape to stdout and exit

Why an exporter of our own: the GPU facts are read once at provision, but a GPU that falls off the
bus, raises Xid errors, throttles or trains its PCIe link down does so while serving. NVIDIA's
DCGM exporter needs DCGM and a container runtime; this one needs only NVML (nvidia-ml-py, already
in the tools venv) and labels every series with the PD role (prefill/decode) and the serving
instance that owns the GPU, so a dashboard can put GPU power beside the decode TPOT.

NVML is read through a pynvml-shaped module named by `--nvml-module` (default `pynvml`). A
rehearsal names its GPU stand-in's module there; the collector below is the same code either way.
A stand-in names itself: its module's `STAND_IN` (what stands in for the GPUs) becomes the `stand_in`
label of every series, empty (so absent in Prometheus) for NVML itself.

Every read that a board does not support is left out (no series) rather than reported as 0; a GPU
that NVML reports as lost gets `pd_gpu_up 0`, and a driver that cannot be initialised gives
`pd_gpu_nvml_up 0` (the exporter retries at each scrape), so the alert rules can tell "no data"
from "GPU gone".
"""

from __future__ import annotations

import argparse
import importlib
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest

# NVML return codes and enum values (nvml.h; stable across driver releases).
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
# nvmlClocksEventReason* bits: why the clocks are below their maximum (throttling and its causes).
CLOCKS_EVENT_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
CLOCKS = {"graphics": NVML_CLOCK_GRAPHICS, "sm": NVML_CLOCK_SM, "memory": NVML_CLOCK_MEM}
# Events drained per GPU and scrape: a storm of Xids must not stall the scrape.
MAX_EVENTS_PER_SCRAPE = 256
GPU_LABELS = ("gpu", "role", "pd_instance", "stand_in")
MHZ = 1_000_000
KIB = 1024


class ExporterError(ValueError):
    """A bad command line: names the flag, the value and what is expected."""


class GpuLost(Exception):
    """NVML answered GPU_IS_LOST for this GPU: it fell off the bus or the driver gave up on it."""


@dataclass(frozen=True)
class Assignment:
    """Which PD role and serving instance own a GPU."""

    role: str
    instance: str


UNASSIGNED = Assignment(role="none", instance="")


def parse_gpu_list(text: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]."""
    gpus: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise ExporterError(f"GPU list {text!r}: {part!r} is not an index or a range like 0-3")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        if last < first:
            raise ExporterError(f"GPU list {text!r}: range {part!r} runs backwards")
        gpus.extend(range(first, last + 1))
    if not gpus:
        raise ExporterError(f"GPU list {text!r} names no GPU")
    return gpus


def parse_assignments(specs: Sequence[str]) -> dict[int, Assignment]:
    """`--assign ROLE[:INSTANCE]=GPUS` specs -> {gpu index: Assignment}; a GPU may have one owner."""
    owners: dict[int, Assignment] = {}
    for spec in specs:
        owner, sep, gpu_text = spec.partition("=")
        role, _, instance = owner.partition(":")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", role):
            raise ExporterError(f"--assign {spec!r}: expected ROLE[:INSTANCE]=GPUS, e.g. decode:decode=4-7")
        assignment = Assignment(role=role, instance=instance or role)
        for gpu in parse_gpu_list(gpu_text):
            if gpu in owners and owners[gpu] != assignment:
                raise ExporterError(
                    f"--assign {spec!r}: GPU {gpu} is already assigned to {owners[gpu].role}:"
                    f"{owners[gpu].instance}; each GPU serves one instance"
                )
            owners[gpu] = assignment
    return owners


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuCollector:
    """A prometheus_client collector that reads every GPU through `nvml` at each scrape."""

    def __init__(
        self, nvml: Any, assignments: dict[int, Assignment] | None = None, expected_gpus: int | None = None
    ) -> None:
        self.nvml = nvml
        self.assignments = assignments or {}
        self.expected_gpus = len(self.assignments) if expected_gpus is None else expected_gpus
        # What stands in for NVML, as the module says (pynvml says nothing: a real GPU).
        self.stand_in = str(getattr(nvml, "STAND_IN", "") or "")
        self._lock = threading.Lock()
        self._initialised = False
        self._event_sets: dict[int, Any] = {}
        self._xids: dict[int, dict[int, int]] = {}
        self._read_errors: dict[int, int] = {}

    # ---- NVML plumbing ----------------------------------------------------------------------
    def _init(self) -> bool:
        if self._initialised:
            return True
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError:
            return False
        self._initialised = True
        self._event_sets = {}
        return True

    def _code(self, err: Exception) -> int | None:
        return getattr(err, "value", None)

    def _read(self, gpu: int, call: Callable[..., Any], *args: Any) -> Any:
        """One NVML read; None where the board lacks it or the read failed (counted)."""
        try:
            return call(*args)
        except self.nvml.NVMLError as err:
            code = self._code(err)
            if code == NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(str(err)) from err
            if code != NVML_ERROR_NOT_SUPPORTED:
                self._read_errors[gpu] = self._read_errors.get(gpu, 0) + 1
            return None

    def _watch_xids(self, gpu: int, handle: Any) -> bool:
        """Register an event set for this GPU's critical Xid errors once; False where unsupported."""
        if gpu in self._event_sets:
            return self._event_sets[gpu] is not None
        event_set = None
        try:
            event_set = self.nvml.nvmlEventSetCreate()
            self.nvml.nvmlDeviceRegisterEvents(handle, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
        except self.nvml.NVMLError:
            event_set = None
        self._event_sets[gpu] = event_set
        return event_set is not None

    def _drain_xids(self, gpu: int) -> None:
        event_set = self._event_sets.get(gpu)
        if event_set is None:
            return
        seen = self._xids.setdefault(gpu, {})
        for _ in range(MAX_EVENTS_PER_SCRAPE):
            try:
                event = self.nvml.nvmlEventSetWait_v2(event_set, 0)
            except self.nvml.NVMLError as err:
                if self._code(err) == NVML_ERROR_GPU_IS_LOST:
                    raise GpuLost(str(err)) from err
                return  # NVML_ERROR_TIMEOUT: nothing pending
            if int(event.eventType) & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                xid = int(event.eventData)
                seen[xid] = seen.get(xid, 0) + 1

    # ---- the scrape -------------------------------------------------------------------------
    def describe(self) -> list[Metric]:
        """Nothing up front: prometheus_client would otherwise call collect() at registration."""
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._collect()

    def _labels(self, gpu: int) -> list[str]:
        owner = self.assignments.get(gpu, UNASSIGNED)
        return [str(gpu), owner.role, owner.instance, self.stand_in]

    def _collect(self) -> Iterator[Metric]:
        nvml, f = self.nvml, _Families()
        f.expected.add_metric([self.stand_in], float(self.expected_gpus))
        count, up = 0, self._init()
        if up:
            try:
                f.driver.add_metric([_text(nvml.nvmlSystemGetDriverVersion()), self.stand_in], 1.0)
                count = int(nvml.nvmlDeviceGetCount())
            except nvml.NVMLError:
                # The driver went away under us: report NVML down and initialise again next scrape.
                self._initialised, up = False, False
        f.nvml_up.add_metric([self.stand_in], 1.0 if up else 0.0)
        for gpu in range(count):
            labels = self._labels(gpu)
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(gpu)
                self._collect_gpu(f, gpu, handle, labels)
                f.up.add_metric(labels, 1.0)
            except (GpuLost, nvml.NVMLError):
                f.up.add_metric(labels, 0.0)
            xids = self._xids.get(gpu, {})
            f.xid_events.add_metric(labels, float(sum(xids.values())))
            for xid, seen in sorted(xids.items()):
                f.xid.add_metric([*labels, str(xid)], float(seen))
            f.read_errors.add_metric(labels, float(self._read_errors.get(gpu, 0)))
        yield from f.all()

    def _collect_gpu(self, f: _Families, gpu: int, handle: Any, labels: list[str]) -> None:
        nvml, read = self.nvml, self._read
        f.xid_watch.add_metric(labels, 1.0 if self._watch_xids(gpu, handle) else 0.0)
        self._drain_xids(gpu)
        uuid = read(gpu, nvml.nvmlDeviceGetUUID, handle)
        name = read(gpu, nvml.nvmlDeviceGetName, handle)
        pci = read(gpu, nvml.nvmlDeviceGetPciInfo, handle)
        f.info.add_metric(
            [*labels, _text(uuid or ""), _text(name or ""), _text(pci.busId) if pci is not None else ""], 1.0
        )
        util = read(gpu, nvml.nvmlDeviceGetUtilizationRates, handle)
        if util is not None:
            f.utilization.add_metric(labels, int(util.gpu) / 100.0)
            f.memory_utilization.add_metric(labels, int(util.memory) / 100.0)
        memory = read(gpu, nvml.nvmlDeviceGetMemoryInfo, handle)
        if memory is not None:
            f.memory_used.add_metric(labels, float(memory.used))
            f.memory_total.add_metric(labels, float(memory.total))
        _put(f.power, labels, read(gpu, nvml.nvmlDeviceGetPowerUsage, handle), 1 / 1000)
        _put(f.power_limit, labels, read(gpu, nvml.nvmlDeviceGetEnforcedPowerLimit, handle), 1 / 1000)
        _put(f.energy, labels, read(gpu, nvml.nvmlDeviceGetTotalEnergyConsumption, handle), 1 / 1000)
        _put(f.temperature, labels, read(gpu, nvml.nvmlDeviceGetTemperature, handle, NVML_TEMPERATURE_GPU))
        for clock, kind in CLOCKS.items():
            _put(f.clock, [*labels, clock], read(gpu, nvml.nvmlDeviceGetClockInfo, handle, kind), MHZ)
        _put(f.pcie_gen, [*labels, "current"], read(gpu, nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle))
        _put(f.pcie_gen, [*labels, "max"], read(gpu, nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle))
        _put(f.pcie_width, [*labels, "current"], read(gpu, nvml.nvmlDeviceGetCurrPcieLinkWidth, handle))
        _put(f.pcie_width, [*labels, "max"], read(gpu, nvml.nvmlDeviceGetMaxPcieLinkWidth, handle))
        for direction, counter in (("tx", NVML_PCIE_UTIL_TX_BYTES), ("rx", NVML_PCIE_UTIL_RX_BYTES)):
            # NVML samples the link for 20 ms and answers in KiB/s.
            value = read(gpu, nvml.nvmlDeviceGetPcieThroughput, handle, counter)
            _put(f.pcie_throughput, [*labels, direction], value, KIB)
        _put(f.pcie_replay, labels, read(gpu, nvml.nvmlDeviceGetPcieReplayCounter, handle))
        for error, error_type in (
            ("corrected", NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            for ecc, counter_type in (("volatile", NVML_VOLATILE_ECC), ("aggregate", NVML_AGGREGATE_ECC)):
                value = read(gpu, nvml.nvmlDeviceGetTotalEccErrors, handle, error_type, counter_type)
                _put(f.ecc, [*labels, error, ecc], value)
        reasons = read(gpu, nvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
        if reasons is not None:
            for reason, bit in CLOCKS_EVENT_REASONS.items():
                f.clocks_event.add_metric([*labels, reason], 1.0 if int(reasons) & bit else 0.0)


def _put(family: Metric, labels: list[str], value: Any, scale: float = 1.0) -> None:
    if value is not None:
        family.add_metric(labels, float(value) * scale)  # type: ignore[attr-defined]


# The metric families: key -> (kind, name, help, extra labels). GPU families carry GPU_LABELS first.
_G, _C = GaugeMetricFamily, CounterMetricFamily
HOST_FAMILIES: dict[str, tuple[type, str, str, tuple[str, ...]]] = {
    "nvml_up": (_G, "pd_gpu_nvml_up", "1 when NVML initialised and answered this scrape.", ()),
    "expected": (_G, "pd_gpu_expected_count", "GPUs this host is expected to serve with.", ()),
    "driver": (_G, "pd_gpu_driver_info", "NVIDIA driver version.", ("driver_version",)),
}
GPU_FAMILIES: dict[str, tuple[type, str, str, tuple[str, ...]]] = {
    "up": (_G, "pd_gpu_up", "1 when the GPU answers NVML; 0 when NVML reports it lost (off the bus).", ()),
    "info": (_G, "pd_gpu_info", "GPU identity.", ("uuid", "name", "pci_bus_id")),
    "utilization": (_G, "pd_gpu_utilization_ratio", "Share of the last sample period a kernel ran.", ()),
    "memory_utilization": (
        _G,
        "pd_gpu_memory_utilization_ratio",
        "Share of the last sample period device memory was read or written.",
        (),
    ),
    "memory_used": (_G, "pd_gpu_memory_used_bytes", "Device memory in use.", ()),
    "memory_total": (_G, "pd_gpu_memory_total_bytes", "Device memory in total.", ()),
    "power": (_G, "pd_gpu_power_watts", "Board power draw.", ()),
    "power_limit": (_G, "pd_gpu_power_limit_watts", "Enforced power limit.", ()),
    "energy": (_C, "pd_gpu_energy_joules", "Energy used since the driver loaded.", ()),
    "temperature": (_G, "pd_gpu_temperature_celsius", "GPU core temperature.", ()),
    "clock": (_G, "pd_gpu_clock_hertz", "Current clock.", ("clock",)),
    "pcie_gen": (_G, "pd_gpu_pcie_link_generation", "PCIe link generation (current, max).", ("link",)),
    "pcie_width": (_G, "pd_gpu_pcie_link_width", "PCIe link width in lanes (current, max).", ("link",)),
    "pcie_throughput": (
        _G,
        "pd_gpu_pcie_throughput_bytes_per_second",
        "PCIe throughput over NVML's 20 ms sample.",
        ("direction",),
    ),
    "pcie_replay": (_C, "pd_gpu_pcie_replay_errors", "PCIe replays (link-level retransmissions).", ()),
    "ecc": (
        _C,
        "pd_gpu_ecc_errors",
        "ECC errors (volatile: since the driver loaded; aggregate: lifetime).",
        ("error", "counter"),
    ),
    "clocks_event": (
        _G,
        "pd_gpu_clocks_event_reason",
        "1 while this reason holds the clocks down (throttling).",
        ("reason",),
    ),
    "xid_watch": (_G, "pd_gpu_xid_watch_active", "1 when NVML delivers this GPU's Xid events.", ()),
    "xid_events": (_C, "pd_gpu_xid_events", "Critical Xid errors seen since the exporter started.", ()),
    "xid": (_C, "pd_gpu_xid_errors", "Critical Xid errors by Xid code.", ("xid",)),
    "read_errors": (_C, "pd_gpu_nvml_read_errors", "NVML reads that failed (other than unsupported).", ()),
}


class _Families:
    """The metric families of one scrape (fresh each time: values are read, not accumulated)."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}
        for key, (kind, name, text, extra) in HOST_FAMILIES.items():
            self._families[key] = kind(name, text, labels=[*extra, "stand_in"])
        for key, (kind, name, text, extra) in GPU_FAMILIES.items():
            self._families[key] = kind(name, text, labels=[*GPU_LABELS, *extra])

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["_families"][key]
        except KeyError:
            raise AttributeError(key) from None

    def all(self) -> Iterator[Metric]:
        for family in self._families.values():
            if family.samples:
                yield family


def load_nvml(name: str) -> Any:
    """Import the NVML module by name; a missing one is a clear error, not a traceback."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise ExporterError(
            f"--nvml-module {name!r} cannot be imported ({err}); install nvidia-ml-py into this "
            "interpreter (the appliance_tools role does for the tools venv)"
        ) from err


def scrape_once(collector: GpuCollector) -> bytes:
    """One scrape in Prometheus' text format (what /metrics would answer)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pd-gpu-exporter", description=__doc__.split("\n")[0])
    p.add_argument("--listen-address", default="127.0.0.1", help="address to serve /metrics on")
    p.add_argument("--port", type=int, default=9835, help="port to serve /metrics on")
    p.add_argument(
        "--assign",
        action="append",
        default=[],
        metavar="ROLE[:INSTANCE]=GPUS",
        help="label GPUs with the PD role and instance that own them, e.g. decode:decode=4-7",
    )
    p.add_argument(
        "--expect-gpus",
        type=int,
        default=None,
        help="GPUs this host should have (pd_gpu_expected_count; default: the assigned ones)",
    )
    p.add_argument("--nvml-module", default="pynvml", help="pynvml-shaped module to read NVML through")
    p.add_argument("--once", action="store_true", help="print one scrape to stdout and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        nvml = load_nvml(args.nvml_module)
        collector = GpuCollector(nvml, parse_assignments(args.assign), args.expect_gpus)
    except ExporterError as err:
        print(f"pd-gpu-exporter: {err}", file=sys.stderr)
        return 2
    if args.once:
        sys.stdout.write(scrape_once(collector).decode())
        return 0
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server, thread = start_http_server(args.port, addr=args.listen_address, registry=registry)
    except OSError as err:
        print(f"pd-gpu-exporter: cannot listen on {args.listen_address}:{args.port}: {err}", file=sys.stderr)
        return 1
    print(
        f"pd-gpu-exporter: serving /metrics on {args.listen_address}:{args.port} "
        f"(NVML module {args.nvml_module}"
        + (f", STAND-IN ({collector.stand_in})" if collector.stand_in else "")
        + ")",
        file=sys.stderr,
        flush=True,
    )
    stop.wait()
    server.shutdown()
    thread.join(timeout=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
