"""Post-install check of NIXL: which backends it can create, and one real transfer.

SGLang's PD transfer (`--disaggregation-transfer-backend nixl`) creates a NIXL agent with the
UCX backend and moves KV cache GPU to GPU. A NIXL wheel that imports but cannot create UCX (a
missing plugin, a UCX built without CUDA) only fails when the first request is handed from prefill
to decode, so the appliance proves both things right after the install:

- every plugin NIXL ships is tried with `create_backend`; UCX (or whatever the site requires) must
  be among those created;
- a buffer is written from one agent to another through the chosen backend, the bytes compared,
  and the bandwidth reported. Where CUDA GPUs exist the buffers live in GPU memory (GPU 0 to GPU 1,
  or GPU 0 to itself on a one-GPU host); elsewhere in host memory (DRAM), named as such.

Run it with the Python of the venv that holds nixl (the SGLang venv):
`python -m pd_appliance.nixl_check --json --require UCX`. The exit status is 0 only when every
required backend was created and the transfer (if asked for) moved the right bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_SIZE_MIB = 256
DEFAULT_ITERATIONS = 10
POLL_TIMEOUT_S = 60.0


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


class _HostBuffers:
    """Two host-memory (DRAM) buffers held by numpy; used when no CUDA GPU is present."""

    mem_type = "DRAM"

    def __init__(self, size_bytes: int) -> None:
        import numpy as np

        self._np = np
        self.src = np.arange(size_bytes, dtype=np.uint8)  # a pattern, not zeros: a no-op copy fails
        self.dst = np.zeros(size_bytes, dtype=np.uint8)
        self.src_device: int | None = None
        self.dst_device: int | None = None

    def regions(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        return (self.src.ctypes.data, self.src.nbytes, 0), (self.dst.ctypes.data, self.dst.nbytes, 0)

    def synchronize(self) -> None:
        return None

    def verified(self) -> bool:
        return bool(self._np.array_equal(self.src, self.dst))


class _CudaBuffers:
    """Two GPU buffers held by torch: GPU `src` to GPU `dst` (the same GPU on a one-GPU host)."""

    mem_type = "VRAM"

    def __init__(self, size_bytes: int, src_device: int, dst_device: int) -> None:
        import torch

        self._torch = torch
        gen = torch.Generator(device="cpu").manual_seed(0)
        pattern = torch.randint(0, 256, (size_bytes,), dtype=torch.uint8, generator=gen)
        self.src = pattern.to(f"cuda:{src_device}")
        self.dst = torch.zeros(size_bytes, dtype=torch.uint8, device=f"cuda:{dst_device}")
        self.src_device = src_device
        self.dst_device = dst_device

    def regions(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        return (
            (self.src.data_ptr(), self.src.numel(), self.src_device),
            (self.dst.data_ptr(), self.dst.numel(), self.dst_device),
        )

    def synchronize(self) -> None:
        for dev in {self.src_device, self.dst_device}:
            self._torch.cuda.synchronize(dev)

    def verified(self) -> bool:
        return bool(self._torch.equal(self.src.cpu(), self.dst.cpu()))


def cuda_device_count() -> int:
    """CUDA GPUs visible to torch, 0 where torch or CUDA is absent (then DRAM is measured)."""
    try:
        import torch
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:
        return 0


def measure_transfer(
    agent_factory: Callable[[str, list[str]], Any],
    backend: str,
    size_bytes: int,
    iterations: int,
    gpus: int,
) -> TransferResult:
    """Write `size_bytes` from one NIXL agent to another `iterations` times, timed; check the bytes.

    Two agents in one process exchange metadata as two hosts would (get_agent_metadata /
    add_remote_agent), so the same path SGLang's NIXL connector takes is exercised: registration,
    remote descriptors, a WRITE request, completion polling.
    """
    if size_bytes <= 0 or iterations <= 0:
        raise ValueError("size_bytes and iterations must be positive")
    if gpus >= 1:
        buffers: Any = _CudaBuffers(size_bytes, 0, 1 if gpus >= 2 else 0)
    else:
        buffers = _HostBuffers(size_bytes)
    src_region, dst_region = buffers.regions()
    mem = buffers.mem_type
    initiator = agent_factory("pd-nixl-check-initiator", [backend])
    target = agent_factory("pd-nixl-check-target", [backend])
    src_reg = initiator.register_memory([(*src_region, "")], mem, backends=[backend])
    dst_reg = target.register_memory([(*dst_region, "")], mem, backends=[backend])
    handle = None
    try:
        remote_name = initiator.add_remote_agent(target.get_agent_metadata())
        local_descs = initiator.get_xfer_descs([src_region], mem)
        remote_descs = target.get_xfer_descs([dst_region], mem)
        handle = initiator.initialize_xfer(
            "WRITE", local_descs, remote_descs, remote_name, b"pd-nixl-check", backends=[backend]
        )
        # One untimed transfer first: connection setup and lazy registration are not bandwidth.
        _post(initiator, handle)
        buffers.synchronize()
        start = time.perf_counter()
        for _ in range(iterations):
            _post(initiator, handle)
        buffers.synchronize()
        seconds = time.perf_counter() - start
        ok = buffers.verified()
    finally:
        if handle is not None:
            initiator.release_xfer_handle(handle)
        initiator.deregister_memory(src_reg, backends=[backend])
        target.deregister_memory(dst_reg, backends=[backend])
    return TransferResult(
        backend=backend,
        mem_type=mem,
        src_device=buffers.src_device,
        dst_device=buffers.dst_device,
        size_bytes=size_bytes,
        iterations=iterations,
        seconds=seconds,
        bandwidth_gb_s=bandwidth_gb_s(size_bytes, iterations, seconds),
        verified=ok,
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
    gpus: int | None = None,
) -> CheckReport:
    """The whole check. `api` is `nixl._api` (imported when None), `gpus` the CUDA GPU count."""
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
            )

    def factory(name: str, backends: list[str]) -> Any:
        return api.nixl_agent(name, api.nixl_agent_config(backends=backends))

    prober = factory("pd-nixl-check-probe", [])
    plugins = sorted(prober.get_plugin_list())
    probes = probe_backends(prober, plugins)
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
        if transfer_backend in missing or transfer_backend not in {p.name for p in probes if p.created}:
            transfer_error = f"skipped: backend {transfer_backend} was not created"
            problems.append(transfer_error)
        else:
            try:
                transfer = measure_transfer(
                    factory,
                    transfer_backend,
                    size_bytes,
                    iterations,
                    cuda_device_count() if gpus is None else gpus,
                )
                if not transfer.verified:
                    problems.append("the transfer completed but the destination bytes differ from the source")
            except Exception as exc:
                transfer_error = f"{type(exc).__name__}: {exc}"
                problems.append(f"transfer through {transfer_backend} failed: {transfer_error}")
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
    )


def apply_bandwidth_floor(report: CheckReport, min_gb_s: float) -> None:
    """Fail the report when a GPU-memory transfer ran below `min_gb_s` (KV moves at that speed)."""
    t = report.transfer
    if min_gb_s <= 0 or t is None or t.mem_type != "VRAM" or t.bandwidth_gb_s >= min_gb_s:
        return
    report.problems.append(
        f"GPU-to-GPU bandwidth through {t.backend} is {t.bandwidth_gb_s:.2f} GB/s, below the floor of "
        f"{min_gb_s:g} GB/s: UCX is likely staging through host memory (check UCX_TLS includes "
        "cuda_ipc, and GPU peer access)"
    )
    report.ok = False


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
    lines.append("OK" if report.ok else "FAILED: " + "; ".join(report.problems))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pd_appliance.nixl_check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--require", action="append", default=None, help="backend that must be created (UCX)")
    parser.add_argument("--transfer-backend", default="UCX", help="backend for the transfer ('' to skip)")
    parser.add_argument("--size-mib", type=int, default=DEFAULT_SIZE_MIB)
    parser.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS)
    parser.add_argument("--host-memory", action="store_true", help="measure DRAM even where GPUs exist")
    parser.add_argument(
        "--min-gb-s",
        type=float,
        default=0.0,
        help="fail when a GPU-memory transfer is slower than this (0: report only)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    args = parser.parse_args(argv)
    required = args.require if args.require is not None else ["UCX"]
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    # Some NIXL plugins (GUSLI) print to file descriptor 1 from C while being probed; send fd 1 to
    # stderr for the duration and keep the real stdout for the JSON the play parses.
    sys.stdout.flush()
    json_fd = os.dup(1)
    os.dup2(2, 1)
    report = run_check(
        required,
        args.transfer_backend or None,
        args.size_mib * 2**20,
        args.iterations,
        gpus=0 if args.host_memory else None,
    )
    apply_bandwidth_floor(report, args.min_gb_s)
    sys.stdout.flush()
    os.dup2(json_fd, 1)
    os.close(json_fd)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2), flush=True)
    print(format_report(report), file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
