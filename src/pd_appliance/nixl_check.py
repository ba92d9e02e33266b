"""Post-install check of NIXL: which backends it can create, and one real prefill -> decode transfer.

SGLang's PD transfer (`--disaggregation-transfer-backend nixl`) creates a NIXL agent with the
UCX backend and writes KV cache from a prefill GPU into a decode GPU. What goes wrong there is
silent: a NIXL wheel that imports but cannot create UCX fails only at the first handoff, and a UCX
that cannot use CUDA IPC (memory from `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, no peer
access, `UCX_TLS` without cuda_ipc) still moves the right bytes, only through host memory or TCP at
a few hundred MB/s (NIXL issue 1754). So the check proves, right after the install:

- every plugin NIXL ships is tried with `create_backend`; UCX (or whatever the site requires) must
  be among those created;
- a buffer is written from one agent to another, GPU memory to GPU memory, from `--src-gpu` (the
  first prefill GPU) to `--dst-gpu` (the first decode GPU), the bytes compared and the bandwidth
  reported. No GPU memory (no torch, no CUDA, too few GPUs) is a failure, never a quiet switch to
  host memory; `--host-memory` is the explicit mode for a host whose GPUs are a stand-in;
- the UCX transport the write used is read from UCX's own protocol table (`UCX_PROTO_INFO=used`,
  printed when the agents close) and named: cuda_ipc, cuda_copy (staged through host memory), tcp,
  an RDMA transport, or shared memory. `--expect-transport cuda_ipc` fails any other;
- whether each buffer can be exported with the legacy CUDA IPC handle UCX's cuda_ipc needs
  (`CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`; 0 for VMM memory, i.e. expandable segments);
- the PCIe link of each GPU in `--link-gpus`, current generation and width against the maximum,
  read through NVML (sysfs where pynvml is absent) while host-to-device copies keep the link busy:
  an idle link drops its generation to save power, so only a loaded link says what it trained to.
- the measured bandwidth against what the deployment needs (`--kv-need-gb-s`, per TP rank pair,
  which the play derives from the model's KV bytes per token and the target line:
  pd_appliance.fabric.kv_need) times `--kv-margin`: a path that cannot carry it fails naming the
  figures; a host-staged path (no P2P, e.g. across sockets: cuda_copy, tcp) that can carry it is a
  warning with the figures. An explicit `--min-gb-s` floor, when given, replaces the derived one.

Run it with the Python of the venv that holds nixl (the SGLang venv):
`python -m pd_appliance.nixl_check --json --require UCX --src-gpu 0 --dst-gpu 4 --kv-need-gb-s 0.1
--kv-margin 10`. The exit status is 0 only when no problem was found. It is also copied to
hosts as a single script, so it imports nothing from pd_appliance.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_SIZE_MIB = 256
DEFAULT_ITERATIONS = 10
POLL_TIMEOUT_S = 60.0
DEFAULT_LINK_LOAD_S = 1.0
# cuda.h: CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10 ("1 if this pointer maps to an
# allocation that is suitable for cudaIpcGetMemHandle, 0 otherwise").
CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10
# sysfs current_link_speed ("32.0 GT/s PCIe") -> PCIe generation.
GT_S_TO_GENERATION = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}
AGENT_INITIATOR = "pd-nixl-check-initiator"
AGENT_TARGET = "pd-nixl-check-target"
# Transports UCX names in its protocol tables, by kind (uct component names).
HOST_SHM_TRANSPORTS = {"cma", "posix", "sysv", "xpmem", "knem", "self"}
# Transport kinds (transport_kind) that move GPU memory without staging it in host memory: CUDA
# IPC between GPUs of one host, RDMA (GPUDirect) between hosts. Every other kind is host-staged.
DIRECT_KINDS = ("cuda_ipc", "rdma")
DEFAULT_KV_MARGIN = 10.0


@dataclass
class BackendProbe:
    """Whether one NIXL plugin could be turned into a backend, and why not."""

    name: str
    created: bool
    error: str | None = None
    mem_types: list[str] = field(default_factory=list)


@dataclass
class TransferResult:
    """One measured transfer: where the bytes went, how many, how fast, and whether they arrived."""

    backend: str
    mem_type: str
    src_device: int | None
    dst_device: int | None
    size_bytes: int
    iterations: int
    seconds: float
    bandwidth_gb_s: float
    verified: bool
    # Whether each buffer could be exported through cudaIpcGetMemHandle (None: not GPU memory, or
    # the driver could not be asked).
    src_ipc_capable: bool | None = None
    dst_ipc_capable: bool | None = None


@dataclass
class ProtoRow:
    """One row of a UCX protocol table: message sizes, what UCX does for them, on which lanes."""

    size_range: str
    description: str
    config: str
    count: int | None = None


@dataclass
class ProtoTable:
    """One UCX protocol table (UCX_PROTO_INFO): a context, an operation, its rows."""

    context: str
    scope: str
    operation: str
    rows: list[ProtoRow] = field(default_factory=list)


@dataclass
class TransportUse:
    """The UCX transports the measured write used, as UCX's protocol table says."""

    kind: str  # cuda_ipc, cuda_copy, tcp, rdma, shm, unknown
    transports: list[str]
    lanes: list[str]
    description: str
    source: str


@dataclass
class LinkReading:
    """A GPU's PCIe link while host-to-device copies kept it busy."""

    gpu: int
    bus_id: str | None
    generation_current: int | None
    generation_max: int | None
    width_current: int | None
    width_max: int | None
    source: str
    h2d_gb_s: float | None = None


@dataclass
class CheckReport:
    """Everything the check found; `ok` is what the play gates on."""

    nixl_module: str | None
    nixl_version: str | None
    plugins: list[str]
    backends: list[BackendProbe]
    required: list[str]
    missing_required: list[str]
    transfer: TransferResult | None
    transfer_error: str | None
    ok: bool
    problems: list[str]
    memory: str = "VRAM"
    transport: TransportUse | None = None
    links: list[LinkReading] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # The KV need against the measured path (apply_kv_path): figures and verdict, or None.
    kv: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fail(self, problem: str) -> None:
        """Record a problem; the report is no longer ok."""
        self.problems.append(problem)
        self.ok = False


def bandwidth_gb_s(size_bytes: int, iterations: int, seconds: float) -> float:
    """Decimal GB/s (1e9 bytes) moved: what UCX and nvbandwidth report, so figures compare."""
    if seconds <= 0:
        raise ValueError(f"elapsed time must be positive, got {seconds!r}")
    return size_bytes * iterations / seconds / 1e9


def probe_backends(agent: Any, plugins: Iterable[str]) -> list[BackendProbe]:
    """Try `create_backend` for each plugin on `agent`; record success, memory types or the error.

    A plugin that needs site configuration (object stores, GDS without a filesystem) fails here
    and that is fine; the caller decides which backends are required.
    """
    probes = []
    for name in plugins:
        try:
            agent.create_backend(name)
        except Exception as exc:  # the bindings raise their own nixl*Error types
            probes.append(BackendProbe(name=name, created=False, error=f"{type(exc).__name__}: {exc}"))
            continue
        mem_types = list(getattr(agent, "backend_mems", {}).get(name, []))
        probes.append(BackendProbe(name=name, created=True, mem_types=[str(m) for m in mem_types]))
    return probes


def missing_backends(probes: Iterable[BackendProbe], required: Iterable[str]) -> list[str]:
    """Required backend names that were not created (case-sensitive, as NIXL names them)."""
    created = {p.name for p in probes if p.created}
    return [name for name in required if name not in created]


def wait_done(agent: Any, handle: Any, timeout_s: float = POLL_TIMEOUT_S) -> None:
    """Poll a posted transfer until DONE; raise on ERR or when it takes longer than `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = agent.check_xfer_state(handle)
        if state == "DONE":
            return
        if state == "ERR":
            raise RuntimeError("NIXL reported ERR for the transfer")
        if time.monotonic() > deadline:
            raise TimeoutError(f"transfer still {state} after {timeout_s:.0f} s")


class NoGpuMemoryError(RuntimeError):
    """GPU memory was asked for and cannot be had: the check fails instead of measuring DRAM."""


def _host_pattern(size_bytes: int) -> Any:
    import numpy as np

    return np.arange(size_bytes, dtype=np.uint8)  # wraps at 256: a pattern, not zeros


class _HostBuffer:
    """A host-memory (DRAM) buffer held by numpy: only for hosts whose GPUs are a stand-in."""

    mem_type = "DRAM"

    def __init__(self, size_bytes: int, fill: bool) -> None:
        import numpy as np

        self._np = np
        self.data = _host_pattern(size_bytes) if fill else np.zeros(size_bytes, dtype=np.uint8)
        self.device: int | None = None

    def region(self) -> tuple[int, int, int]:
        return (self.data.ctypes.data, self.data.nbytes, 0)

    def synchronize(self) -> None:
        return None

    def holds_pattern(self) -> bool:
        return bool(self._np.array_equal(self.data, _host_pattern(self.data.nbytes)))

    def ipc_capable(self) -> bool | None:
        return None


class _CudaBuffer:
    """A GPU buffer held by torch on GPU `device`: the seeded pattern (source) or zeros (target)."""

    mem_type = "VRAM"

    def __init__(self, size_bytes: int, device: int, fill: bool) -> None:
        try:
            import torch
        except ImportError as err:
            raise NoGpuMemoryError(
                f"torch is not importable ({err}), so no GPU memory can be allocated"
            ) from err
        if not torch.cuda.is_available():
            raise NoGpuMemoryError(
                "torch sees no CUDA device (driver not loaded, or CUDA_VISIBLE_DEVICES='')"
            )
        count = int(torch.cuda.device_count())
        if device >= count:
            raise NoGpuMemoryError(f"GPU {device} was asked for but torch sees {count} GPU(s)")
        self._torch = torch
        self.device: int | None = device
        if fill:
            self.data = self._pattern(size_bytes).to(f"cuda:{device}")
        else:
            self.data = torch.zeros(size_bytes, dtype=torch.uint8, device=f"cuda:{device}")

    def _pattern(self, size_bytes: int) -> Any:
        gen = self._torch.Generator(device="cpu").manual_seed(0)
        return self._torch.randint(0, 256, (size_bytes,), dtype=self._torch.uint8, generator=gen)

    def region(self) -> tuple[int, int, int]:
        return (self.data.data_ptr(), self.data.numel(), int(self.device or 0))

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self.device)

    def holds_pattern(self) -> bool:
        return bool(self._torch.equal(self.data.cpu(), self._pattern(self.data.numel())))

    def ipc_capable(self) -> bool | None:
        return legacy_ipc_capable(self.data.data_ptr())


def make_buffer(size_bytes: int, device: int, host_memory: bool, fill: bool) -> Any:
    """A GPU buffer on `device`, or a DRAM buffer when the host's GPUs are a stand-in."""
    return _HostBuffer(size_bytes, fill) if host_memory else _CudaBuffer(size_bytes, device, fill)


def legacy_ipc_capable(pointer: int, libcuda: Any = None) -> bool | None:
    """Whether cudaIpcGetMemHandle can export the allocation behind `pointer` (what cuda_ipc needs).

    Asks the driver (cuPointerGetAttribute, IS_LEGACY_CUDA_IPC_CAPABLE): 1 for cudaMalloc memory,
    0 for VMM memory (cuMemCreate, which PyTorch uses with expandable_segments:True). None when the
    driver library cannot be loaded or answers with an error.
    """
    try:
        lib = libcuda if libcuda is not None else ctypes.CDLL("libcuda.so.1")
        value = ctypes.c_int(-1)
        status = lib.cuPointerGetAttribute(
            ctypes.byref(value), CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ctypes.c_uint64(pointer)
        )
    except (OSError, AttributeError):
        return None
    if status != 0 or value.value not in (0, 1):
        return None
    return bool(value.value)


def _target_process(conn: Any, backend: str, size_bytes: int, device: int, host_memory: bool) -> None:
    """The receiving side, in a process of its own as SGLang's decode worker is.

    CUDA IPC handles cannot be opened by the process that exported them, so UCX never offers
    cuda_ipc between two agents of one process: the target lives here, registers a zeroed buffer,
    hands its agent metadata and region to the writer, then checks the bytes when told to.
    """
    try:
        api, _, _ = import_nixl()
        buffer = make_buffer(size_bytes, device, host_memory, fill=False)
        agent = api.nixl_agent(AGENT_TARGET, api.nixl_agent_config(backends=[backend]))
        reg = agent.register_memory([(*buffer.region(), "")], buffer.mem_type, backends=[backend])
    except NoGpuMemoryError as exc:
        conn.send({"error": str(exc), "no_gpu_memory": True})
        return
    except Exception as exc:
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        return
    conn.send(
        {"metadata": agent.get_agent_metadata(), "region": buffer.region(), "mem_type": buffer.mem_type}
    )
    try:
        while (command := conn.recv()) == "verify":
            buffer.synchronize()
            conn.send({"verified": buffer.holds_pattern(), "ipc_capable": buffer.ipc_capable()})
        if command != "close":
            return
    finally:
        agent.deregister_memory(reg, backends=[backend])
        del agent
        gc.collect()


class TargetProcess:
    """The target agent's process, seen from the writer: start, metadata, verify, close."""

    def __init__(self, backend: str, size_bytes: int, device: int, host_memory: bool) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # a fresh CUDA context, never a forked one
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_target_process, args=(child, backend, size_bytes, device, host_memory), daemon=True
        )
        self._proc.start()
        child.close()

    def _recv(self, timeout_s: float) -> dict[str, Any]:
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"the target process did not answer within {timeout_s:.0f} s")
        answer: dict[str, Any] = self._conn.recv()
        if "error" in answer:
            error = NoGpuMemoryError if answer.get("no_gpu_memory") else RuntimeError
            raise error(f"target process: {answer['error']}")
        return answer

    def ready(self, timeout_s: float = POLL_TIMEOUT_S * 2) -> dict[str, Any]:
        return self._recv(timeout_s)

    def verify(self, timeout_s: float = POLL_TIMEOUT_S) -> dict[str, Any]:
        self._conn.send("verify")
        return self._recv(timeout_s)

    def close(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send("close")
        self._proc.join(POLL_TIMEOUT_S)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()


def measure_transfer(
    agent_factory: Callable[[str, list[str]], Any],
    backend: str,
    size_bytes: int,
    iterations: int,
    source: Any,
    target: Any,
) -> TransferResult:
    """Write `size_bytes` from this process's agent into the target's `iterations` times, timed.

    The two agents exchange metadata as two hosts would (get_agent_metadata / add_remote_agent), so
    the path SGLang's NIXL connector takes is exercised: registration, remote descriptors, a WRITE
    request, completion polling. The initiator is dropped before this returns, which is when UCX
    prints the protocols it used (UCX_PROTO_INFO=used).
    """
    if size_bytes <= 0 or iterations <= 0:
        raise ValueError("size_bytes and iterations must be positive")
    peer = target.ready()
    mem = source.mem_type
    initiator = agent_factory(AGENT_INITIATOR, [backend])
    src_reg = initiator.register_memory([(*source.region(), "")], mem, backends=[backend])
    handle = None
    try:
        remote_name = initiator.add_remote_agent(peer["metadata"])
        local_descs = initiator.get_xfer_descs([source.region()], mem)
        remote_descs = initiator.get_xfer_descs([tuple(peer["region"])], peer["mem_type"])
        handle = initiator.initialize_xfer(
            "WRITE", local_descs, remote_descs, remote_name, b"pd-nixl-check", backends=[backend]
        )
        # One untimed transfer first: connection setup and lazy registration are not bandwidth.
        _post(initiator, handle)
        source.synchronize()
        start = time.perf_counter()
        for _ in range(iterations):
            _post(initiator, handle)
        source.synchronize()
        seconds = time.perf_counter() - start
        checked = target.verify()
    finally:
        if handle is not None:
            initiator.release_xfer_handle(handle)
        initiator.deregister_memory(src_reg, backends=[backend])
        del initiator
        gc.collect()
    dst_region = peer["region"]
    return TransferResult(
        backend=backend,
        mem_type=mem,
        src_device=source.device,
        dst_device=None if mem == "DRAM" else int(dst_region[2]),
        size_bytes=size_bytes,
        iterations=iterations,
        seconds=seconds,
        bandwidth_gb_s=bandwidth_gb_s(size_bytes, iterations, seconds),
        verified=bool(checked["verified"]),
        src_ipc_capable=source.ipc_capable(),
        dst_ipc_capable=checked["ipc_capable"],
    )


def _post(agent: Any, handle: Any) -> None:
    state = agent.transfer(handle)
    if state == "ERR":
        raise RuntimeError("NIXL refused to post the transfer (ERR)")
    if state != "DONE":
        wait_done(agent, handle)


def import_nixl() -> tuple[Any, str, str | None]:
    """Import NIXL the way SGLang does (`nixl._api`); return (module, its name, the version).

    The `nixl` meta package is only a shim over `nixl_cu13`/`nixl_cu12`; the version reported is
    the backend wheel's, since that is the one carrying UCX.
    """
    from importlib import metadata

    import nixl._api as api  # type: ignore[import-not-found]

    module_name = api.__name__.split(".")[0]
    version = None
    for dist in (module_name.replace("_", "-"), "nixl"):
        try:
            version = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    return api, module_name, version


def run_check(
    required: list[str],
    transfer_backend: str | None,
    size_bytes: int,
    iterations: int,
    api: Any = None,
    src_gpu: int = 0,
    dst_gpu: int | None = None,
    host_memory: bool = False,
    target_factory: Callable[[str, int, int, bool], Any] = TargetProcess,
) -> CheckReport:
    """The whole check. `api` is `nixl._api` (imported when None); `dst_gpu` None means GPU 1 when
    there are two GPUs, else GPU 0 (see `default_dst_gpu`)."""
    memory = "DRAM (host memory: GPU stand-in)" if host_memory else "VRAM"
    module_name = version = None
    if api is None:
        try:
            api, module_name, version = import_nixl()
        except Exception as exc:
            return CheckReport(
                nixl_module=None,
                nixl_version=None,
                plugins=[],
                backends=[],
                required=required,
                missing_required=list(required),
                transfer=None,
                transfer_error=None,
                ok=False,
                problems=[
                    f"cannot import nixl._api: {type(exc).__name__}: {exc} (install nixl-cu13 and nixl)"
                ],
                memory=memory,
            )

    def factory(name: str, backends: list[str]) -> Any:
        return api.nixl_agent(name, api.nixl_agent_config(backends=backends))

    prober = factory("pd-nixl-check-probe", [])
    plugins = sorted(prober.get_plugin_list())
    probes = probe_backends(prober, plugins)
    del prober
    missing = missing_backends(probes, required)
    problems = [f"required NIXL backend {name} could not be created" for name in missing]
    for name in missing:
        detail = next((p.error for p in probes if p.name == name and p.error), None)
        if name not in plugins:
            problems.append(f"{name}: no such plugin in this NIXL build (plugins: {', '.join(plugins)})")
        elif detail:
            problems.append(f"{name}: {detail}")
    transfer = None
    transfer_error = None
    if transfer_backend:
        if transfer_backend not in {p.name for p in probes if p.created}:
            transfer_error = f"skipped: backend {transfer_backend} was not created"
            problems.append(transfer_error)
        else:
            dst = default_dst_gpu(src_gpu) if dst_gpu is None else dst_gpu
            target = None
            try:
                target = target_factory(transfer_backend, size_bytes, dst, host_memory)
                source = make_buffer(size_bytes, src_gpu, host_memory, fill=True)
                transfer = measure_transfer(factory, transfer_backend, size_bytes, iterations, source, target)
                if not transfer.verified:
                    problems.append("the transfer completed but the destination bytes differ from the source")
            except NoGpuMemoryError as exc:
                transfer_error = f"no GPU memory: {exc}"
                problems.append(
                    f"cannot measure GPU {src_gpu} -> GPU {dst} in GPU memory: {exc}. The check does not "
                    "fall back to host memory; fix the GPU stack (driver, torch with CUDA, nixl_check_src_gpu"
                    " / nixl_check_dst_gpu), or pass --host-memory only on a host whose GPUs are a stand-in"
                )
            except Exception as exc:
                transfer_error = f"{type(exc).__name__}: {exc}"
                problems.append(f"transfer through {transfer_backend} failed: {transfer_error}")
            finally:
                if target is not None:
                    target.close()
    gc.collect()
    return CheckReport(
        nixl_module=module_name,
        nixl_version=version,
        plugins=plugins,
        backends=probes,
        required=required,
        missing_required=missing,
        transfer=transfer,
        transfer_error=transfer_error,
        ok=not problems,
        problems=problems,
        memory=memory,
    )


def default_dst_gpu(src_gpu: int) -> int:
    """GPU 1 where a second GPU exists (a peer of GPU 0), else the source GPU itself."""
    try:
        import torch

        count = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:
        count = 0
    return 1 if count >= 2 and src_gpu == 0 else src_gpu


# ---- UCX protocol tables (UCX_PROTO_INFO) -----------------------------------------------------

_LOG_PREFIX = re.compile(r"^\[[\d.]+\]\s+\[[^\]]*\]\s*(?:\S+\.c:\d+\s+UCX\s+\w+\s+)?")
_CONTEXT = re.compile(r"^(?P<context>\S+)\s+(?P<scope>self|intra-node|inter-node|loopback)\s+cfg#\d+$")
_LANE = re.compile(r"\b([a-z][a-z0-9_]*)/[^\s/|]+")
_SIZE = re.compile(r"^(\d+)([KMGT]?)$")
_SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _cells(line: str) -> list[str] | None:
    """The cells of a table row "| a | b |", or None for any other line (borders included)."""
    text = _LOG_PREFIX.sub("", line.rstrip()).strip()
    if not (text.startswith("|") and text.endswith("|")) or len(text) < 2:
        return None
    return [cell.strip() for cell in text[1:-1].split("|")]


def parse_proto_tables(text: str) -> list[ProtoTable]:
    """Every UCX protocol table in `text` (log lines as UCX prints them).

    Two layouts exist: UCX 1.13-1.19 put context and operation in one row ("| ctx intra-node
    cfg#1 | remote memory write by ... |"), newer releases in two rows; UCX_PROTO_INFO=used adds a
    Count column. Rows are "| range | description | config |" with the optional count first.
    """
    tables: list[ProtoTable] = []
    current: ProtoTable | None = None
    has_count = False
    for line in text.splitlines():
        cells = _cells(line)
        if cells is None:
            continue
        context = _CONTEXT.match(cells[0])
        if context:
            current = ProtoTable(
                context.group("context"), context.group("scope"), cells[1] if len(cells) > 1 else ""
            )
            tables.append(current)
            has_count = False
            continue
        if current is None:
            continue
        if len(cells) == 1:
            if not current.operation:
                current.operation = cells[0]
            continue
        if "Range" in cells and "Description" in cells:
            has_count = cells[0] == "Count"
            continue
        if has_count and len(cells) >= 4 and cells[0].isdigit():
            current.rows.append(ProtoRow(cells[1], cells[2], cells[3], int(cells[0])))
        elif len(cells) >= 3:
            current.rows.append(ProtoRow(cells[0], cells[1], cells[2]))
    return tables


def _size(text: str) -> float:
    if text == "inf":
        return float("inf")
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a UCX size: {text!r}")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def row_covers(row: ProtoRow, size: int) -> bool:
    """Whether a row's message-size range ("0..2K", "9384..inf", "0") holds `size` bytes."""
    low, _, high = row.size_range.partition("..")
    try:
        return _size(low) <= size <= _size(high or low)
    except ValueError:
        return False


def transport_kind(transports: Iterable[str]) -> str:
    """One word for a set of UCX transports: what an operator must know about the path."""
    names = set(transports)
    if not names:
        return "unknown"
    if names == {"cuda_ipc"}:
        return "cuda_ipc"
    if "tcp" in names:
        return "tcp"
    if "cuda_copy" in names or "gdr_copy" in names:
        return "cuda_copy"
    if any(n.startswith(("rc", "dc", "ud", "ib")) for n in names):
        return "rdma"
    if names <= HOST_SHM_TRANSPORTS:
        return "shm"
    if "cuda_ipc" in names:
        return "mixed"
    return "+".join(sorted(names))


def write_transport(text: str, size_bytes: int, source: str, context: str = AGENT_INITIATOR) -> TransportUse:
    """The transport of the check's NIXL WRITE (ucp_put from the initiator), from UCX's tables.

    With counts (UCX_PROTO_INFO=used) the rows used at least once count; without them, the row
    whose size range holds the transfer size.
    """
    lanes: list[str] = []
    descriptions: list[str] = []
    for table in parse_proto_tables(text):
        if table.context != context or not table.operation.startswith("remote memory write"):
            continue
        for row in table.rows:
            used = row.count > 0 if row.count is not None else row_covers(row, size_bytes)
            if used:
                lanes.append(row.config)
                descriptions.append(row.description)
    transports = sorted({m.group(1) for lane in lanes for m in _LANE.finditer(lane)})
    return TransportUse(
        kind=transport_kind(transports),
        transports=transports,
        lanes=sorted(set(lanes)),
        description="; ".join(sorted(set(descriptions))),
        source=source,
    )


@contextlib.contextmanager
def captured_output() -> Iterator[Path]:
    """Send file descriptors 1 and 2 to a temporary file (UCX and the plugins print from C).

    Yields the file's path; on exit the descriptors are restored and what was written is copied to
    the real stderr, so the log still shows it.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.NamedTemporaryFile(prefix="pd-nixl-check-", suffix=".log", delete=False) as tmp:
        path = Path(tmp.name)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield path
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for d in (fd, *saved):
            os.close(d)
        sys.stderr.write(path.read_text(errors="replace"))
        sys.stderr.flush()


def apply_transport(report: CheckReport, log_text: str, expected: str, source: str) -> None:
    """Name the transport the write used and fail when `expected` (e.g. cuda_ipc) was not it."""
    t = report.transfer
    if t is None:
        return
    use = write_transport(log_text, t.size_bytes, source)
    report.transport = use
    if not expected:
        return
    if use.kind == "unknown":
        report.fail(
            f"the UCX transport of the write could not be read ({source} printed no table for "
            f"{AGENT_INITIATOR}); a UCX older than 1.21 ignores UCX_PROTO_INFO=used: run with "
            f"--proto-info y, or drop the expectation (nixl_check_expect_transport: '')"
        )
        return
    if use.kind != expected:
        hints = [
            "UCX_TLS must include cuda_ipc (serving_ucx_tls)",
            "no PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (VMM memory cannot use cuda_ipc)",
            "the GPUs need peer access (nvidia-smi topo -p2p w; BIOS ACS/IOMMU)",
        ]
        if t.src_ipc_capable is False or t.dst_ipc_capable is False:
            hints.insert(0, "the buffers are not legacy-IPC capable (VMM/expandable segments memory)")
        report.fail(
            f"GPU {t.src_device} -> GPU {t.dst_device} went through {use.kind} "
            f"({', '.join(use.lanes) or 'no lane'}; {use.description}), not {expected}: KV would be "
            f"staged through host memory or the network. Check: {'; '.join(hints)}"
        )


@dataclass
class KvRequirement:
    """What the measured path must carry: the need per TP rank pair, the margin, or an explicit floor."""

    need_gb_s: float = 0.0
    margin: float = DEFAULT_KV_MARGIN
    floor_gb_s: float = 0.0
    basis: str = ""

    def required(self) -> tuple[float, str]:
        """(GB/s the path must reach, where that figure comes from); 0 when nothing is known.

        An explicit floor wins over the derived need: it is the operator's own figure (for a
        workload other than the target line); the need is still reported beside it.
        """
        need = f"the need is {self.need_gb_s:.4g} GB/s per TP rank pair" if self.need_gb_s > 0 else ""
        if self.floor_gb_s > 0:
            return self.floor_gb_s, "the explicit floor nixl_check_min_bandwidth_gb_s" + (
                f"; {need}" if need else ""
            )
        if self.need_gb_s > 0:
            return self.need_gb_s * self.margin, f"{need} x margin {self.margin:g}"
        return 0.0, ""


def _path_words(report: CheckReport) -> tuple[str, bool]:
    """("tcp (tcp/lo)", host-staged?) for the measured write's transport."""
    use = report.transport
    kind = use.kind if use is not None else "unknown"
    lanes = ", ".join(use.lanes) if use is not None and use.lanes else ""
    return (f"{kind} ({lanes})" if lanes else kind), kind not in DIRECT_KINDS


def apply_kv_path(report: CheckReport, need: KvRequirement) -> None:
    """Judge the measured GPU-to-GPU path by the figures: what the deployment needs, what it got.

    - measured below what is required (need x margin, or the explicit floor): a problem naming
      needed GB/s, measured GB/s, the path and the margin;
    - a host-staged path (anything but cuda_ipc or RDMA: no P2P between the GPUs, e.g. across
      sockets) that covers it: a warning with the same figures (PD works; each handoff is slower);
    - a host-staged path with nothing to judge it by: a problem saying what to give.
    Host-memory runs (a GPU stand-in) are not judged.
    """
    t = report.transfer
    if t is None or t.mem_type != "VRAM":
        return
    required, source = need.required()
    path, staged = _path_words(report)
    where = f"GPU {t.src_device} -> GPU {t.dst_device}"
    measured = t.bandwidth_gb_s
    figures = {
        "need_gb_s": need.need_gb_s or None,
        "margin": need.margin,
        "floor_gb_s": need.floor_gb_s or None,
        "required_gb_s": required or None,
        "measured_gb_s": measured,
        "path": path,
        "host_staged": staged,
        "basis": need.basis,
    }
    need_words = f" Need: {need.basis}." if need.basis and need.need_gb_s > 0 else ""
    if required <= 0:
        figures["verdict"] = "unjudged"
        if staged:
            figures["verdict"] = "fail"
            report.fail(
                f"{where} moves KV host-staged over {path} at {measured:.3g} GB/s and there is nothing to "
                "judge that by: give the KV need (--kv-need-gb-s; the play derives it from the model and "
                "validation_target_output_tok_s) or an explicit floor (--min-gb-s)"
                + (f" ({need.basis})" if need.basis else "")
            )
        report.kv = figures
        return
    ratio = measured / need.need_gb_s if need.need_gb_s > 0 else None
    if measured < required:
        figures["verdict"] = "fail"
        fix = (
            "give the pair P2P (keep each prefill -> decode pair on one socket, docs/fabric.md; or enable "
            "cross-socket P2P in the BIOS where the platform has it), or lower the target line or "
            "appliance_kv_margin if the measured rate is enough for you"
            if staged
            else "the path is direct yet slow: check the links under load (below) and what else uses them"
        )
        report.fail(
            f"{where} moves KV over {path}{' (host-staged)' if staged else ''} at {measured:.3g} GB/s, below "
            f"the {required:.3g} GB/s required ({source}).{need_words} Fix: {fix}"
        )
    elif staged:
        figures["verdict"] = "warn"
        covers = f" ({ratio:.0f}x the need)" if ratio is not None else ""
        report.warnings.append(
            f"{where} moves KV host-staged over {path} at {measured:.3g} GB/s{covers}, which covers the "
            f"{required:.3g} GB/s required ({source}).{need_words} PD works; each handoff waits on host "
            "memory. Causes: no P2P between the GPUs (different sockets), UCX_TLS without cuda_ipc, or "
            "expandable_segments memory"
        )
    else:
        figures["verdict"] = "ok"
    report.kv = figures


def apply_bandwidth_floor(report: CheckReport, min_gb_s: float) -> None:
    """An explicit floor alone (no derived need): `apply_kv_path` with only `min_gb_s`."""
    if min_gb_s > 0:
        apply_kv_path(report, KvRequirement(floor_gb_s=min_gb_s))


# ---- PCIe link under load ------------------------------------------------------------------------


def _nvml_link(nvml: Any, index: int) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    bus_id = nvml.nvmlDeviceGetPciInfo(handle).busId
    return {
        "bus_id": bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id),
        "generation_current": int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
        "generation_max": int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
        "width_current": int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
        "width_max": int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
    }


def _sysfs_generation(text: str | None) -> int | None:
    if not text:
        return None
    return GT_S_TO_GENERATION.get(text.split()[0])


def _sysfs_link(address: str, root: Path = Path("/sys")) -> dict[str, Any]:
    dev = root / "bus" / "pci" / "devices" / address

    def read(name: str) -> str | None:
        try:
            return (dev / name).read_text().strip()
        except OSError:
            return None

    def number(name: str) -> int | None:
        value = read(name)
        return int(value) if value and value.isdigit() else None

    return {
        "bus_id": address,
        "generation_current": _sysfs_generation(read("current_link_speed")),
        "generation_max": _sysfs_generation(read("max_link_speed")),
        "width_current": number("current_link_width"),
        "width_max": number("max_link_width"),
    }


def read_links_under_load(gpus: list[int], load_s: float) -> list[LinkReading]:
    """Copy pinned host memory to each GPU for `load_s` seconds and read its link meanwhile.

    NVML numbers GPUs by PCI bus id, as CUDA does with CUDA_DEVICE_ORDER=PCI_BUS_ID (the serving
    role's setting); the reading keeps the highest generation and width seen under load.
    """
    import torch

    try:
        import pynvml

        pynvml.nvmlInit()
        nvml: Any = pynvml
    except Exception:
        nvml = None
    readings = []
    try:
        for gpu in gpus:
            readings.append(_load_one(torch, nvml, gpu, load_s))
    finally:
        if nvml is not None:
            nvml.nvmlShutdown()
    return readings


def _load_one(torch: Any, nvml: Any, gpu: int, load_s: float) -> LinkReading:
    host = torch.empty(64 * 2**20, dtype=torch.uint8).pin_memory()
    dev = torch.empty_like(host, device=f"cuda:{gpu}")
    stop = threading.Event()
    moved = [0]

    def load() -> None:
        while not stop.is_set():
            dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize(gpu)
            moved[0] += host.numel()

    worker = threading.Thread(target=load, daemon=True)
    start = time.perf_counter()
    worker.start()
    best: dict[str, Any] = {}
    source = "nvml" if nvml is not None else "sysfs"
    deadline = start + load_s
    while time.perf_counter() < deadline:
        time.sleep(min(0.05, load_s / 4))
        if nvml is not None:
            sample = _nvml_link(nvml, gpu)
        else:
            props = torch.cuda.get_device_properties(gpu)
            address = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            sample = _sysfs_link(address)
        for key, value in sample.items():
            if key == "bus_id" or best.get(key) is None or (value is not None and value > best[key]):
                best[key] = value
    stop.set()
    worker.join()
    seconds = time.perf_counter() - start
    return LinkReading(
        gpu=gpu,
        bus_id=best.get("bus_id"),
        generation_current=best.get("generation_current"),
        generation_max=best.get("generation_max"),
        width_current=best.get("width_current"),
        width_max=best.get("width_max"),
        source=source,
        h2d_gb_s=round(moved[0] / seconds / 1e9, 2) if seconds > 0 else None,
    )


def _below(current: int | None, maximum: int | None) -> bool:
    return current is not None and maximum is not None and current < maximum


def link_problems(readings: Iterable[LinkReading]) -> list[str]:
    """A sentence for each GPU whose loaded link runs below the generation or width it can do."""
    found = []
    for r in readings:
        short = []
        if _below(r.generation_current, r.generation_max):
            short.append(f"Gen{r.generation_current} of Gen{r.generation_max}")
        if _below(r.width_current, r.width_max):
            short.append(f"x{r.width_current} of x{r.width_max}")
        if short:
            found.append(
                f"GPU {r.gpu} ({r.bus_id}) PCIe link under load runs at {' and '.join(short)}: reseat the "
                "card or riser, check the slot's BIOS link speed setting, and look for AER errors "
                "(journalctl -k | grep -i aer); a link that retrained down slows every KV transfer"
            )
    return found


def apply_links(report: CheckReport, readings: list[LinkReading], severity: str) -> None:
    """Record the readings; a degraded link is a problem or a warning as `severity` says."""
    report.links = readings
    for sentence in link_problems(readings):
        if severity == "fail":
            report.fail(sentence)
        elif severity == "warn":
            report.warnings.append(sentence)


def format_report(report: CheckReport) -> str:
    """Human-readable summary for logs and the validation report."""
    lines = [f"NIXL {report.nixl_version or '?'} ({report.nixl_module or 'not importable'})"]
    created = [p.name for p in report.backends if p.created]
    lines.append(f"backends created: {', '.join(created) or 'none'}")
    failed = [p.name for p in report.backends if not p.created]
    if failed:
        lines.append(f"backends not created: {', '.join(failed)}")
    t = report.transfer
    if t is not None:
        where = f"GPU {t.src_device} -> GPU {t.dst_device}" if t.mem_type == "VRAM" else "host DRAM -> DRAM"
        lines.append(
            f"transfer {t.backend} {where}: {t.size_bytes / 2**20:.0f} MiB x {t.iterations} in "
            f"{t.seconds:.4f} s = {t.bandwidth_gb_s:.1f} GB/s, bytes {'verified' if t.verified else 'DIFFER'}"
        )
    elif report.transfer_error:
        lines.append(f"transfer: {report.transfer_error}")
    if report.transport is not None:
        u = report.transport
        lines.append(f"UCX transport: {u.kind} ({', '.join(u.lanes) or 'no table'}) [{u.source}]")
    for r in report.links:
        lines.append(
            f"GPU {r.gpu} link under load: Gen{r.generation_current}/{r.generation_max} "
            f"x{r.width_current}/{r.width_max} ({r.source}), H2D {r.h2d_gb_s} GB/s"
        )
    if report.kv is not None and report.kv.get("required_gb_s"):
        k = report.kv
        lines.append(
            f"KV path: {k['measured_gb_s']:.3g} GB/s over {k['path']} against {k['required_gb_s']:.3g} GB/s "
            f"required ({k['verdict']})"
        )
    lines.extend(f"WARNING: {w}" for w in report.warnings)
    lines.append("OK" if report.ok else "FAILED: " + "; ".join(report.problems))
    return "\n".join(lines)


def _gpu_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pd_appliance.nixl_check", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--require", action="append", default=None, help="backend that must be created (UCX)")
    parser.add_argument("--transfer-backend", default="UCX", help="backend for the transfer ('' to skip)")
    parser.add_argument("--size-mib", type=int, default=DEFAULT_SIZE_MIB)
    parser.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS)
    parser.add_argument("--src-gpu", type=int, default=0, help="GPU the bytes leave (the first prefill GPU)")
    parser.add_argument(
        "--dst-gpu",
        type=int,
        default=None,
        help="GPU the bytes land on (the first decode GPU; default 1, or 0)",
    )
    parser.add_argument(
        "--host-memory",
        action="store_true",
        help="the host's GPUs are a stand-in (no GPU here): measure host DRAM, reported as such",
    )
    parser.add_argument(
        "--expect-transport",
        default="",
        help="fail unless the write used this UCX transport kind (cuda_ipc); '' only reports it",
    )
    parser.add_argument(
        "--proto-info",
        choices=["used", "y", "off"],
        default="used",
        help="UCX_PROTO_INFO for reading the transport: used (UCX >= 1.21), y (older UCX) or off",
    )
    parser.add_argument(
        "--link-gpus", default=None, help="GPUs whose link is read under load (default: src,dst)"
    )
    parser.add_argument("--link-load-s", type=float, default=DEFAULT_LINK_LOAD_S)
    parser.add_argument("--link-check", choices=["fail", "warn", "skip"], default="warn")
    parser.add_argument(
        "--min-gb-s",
        type=float,
        default=0.0,
        help="explicit floor in GB/s: replaces need x margin when > 0 (0: use the need)",
    )
    parser.add_argument(
        "--kv-need-gb-s",
        type=float,
        default=0.0,
        help="KV rate one prefill -> decode rank pair needs at the target line (0: unknown)",
    )
    parser.add_argument(
        "--kv-margin", type=float, default=DEFAULT_KV_MARGIN, help="times the need to require"
    )
    parser.add_argument("--kv-basis", default="", help="how the need was computed, for the messages")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report_out = sys.stdout
    if args.json:
        # The JSON is the only thing on stdout: NIXL's and UCX's C code (at teardown too, after the
        # report) and the target agent's process write to file descriptor 1, which from here on is
        # stderr; the report goes to a private copy of the real stdout.
        sys.stdout.flush()
        report_out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
    required = args.require if args.require is not None else ["UCX"]
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    source = "none"
    if args.proto_info != "off" and "UCX_PROTO_INFO" not in os.environ:
        os.environ["UCX_PROTO_INFO"] = args.proto_info
    if "UCX_PROTO_INFO" in os.environ:
        source = f"UCX_PROTO_INFO={os.environ['UCX_PROTO_INFO']}"
    # UCX and some NIXL plugins (GUSLI) print to file descriptors 1 and 2 from C: capture both, read
    # UCX's protocol tables from them, and keep the real stdout for the JSON the play parses.
    with captured_output() as log_path:
        report = run_check(
            required,
            args.transfer_backend or None,
            args.size_mib * 2**20,
            args.iterations,
            src_gpu=args.src_gpu,
            dst_gpu=args.dst_gpu,
            host_memory=args.host_memory,
        )
        gc.collect()
    log_text = log_path.read_text(errors="replace")
    log_path.unlink(missing_ok=True)
    apply_transport(report, log_text, "" if args.host_memory else args.expect_transport, source)
    apply_kv_path(report, KvRequirement(args.kv_need_gb_s, args.kv_margin, args.min_gb_s, args.kv_basis))
    if args.link_check != "skip" and not args.host_memory and report.transfer is not None:
        t = report.transfer
        gpus = (
            _gpu_list(args.link_gpus)
            if args.link_gpus is not None
            else sorted({d for d in (t.src_device, t.dst_device) if d is not None})
        )
        try:
            apply_links(report, read_links_under_load(gpus, args.link_load_s), args.link_check)
        except Exception as exc:
            report.warnings.append(
                f"the PCIe links could not be read under load: {type(exc).__name__}: {exc}"
            )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2), file=report_out, flush=True)
    print(format_report(report), file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
