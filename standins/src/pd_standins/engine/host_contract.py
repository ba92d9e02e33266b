"""What SGLang 0.5.23 demands of the host at start-up, checked by the rehearsal engine as the user it runs as.

A real worker resolves its cache locations from the environment the way each library does, creates
them and writes there on the first JIT compile; a location the worker's user cannot write fails the
start with the library's own PermissionError. The rehearsal engine resolves the same locations, with
the same variables, precedence and fallback to the home directory, then creates each, writes a
file and reads it back. A failure is logged as Python prints the real one (`PermissionError:
[Errno 13] Permission denied: '<path>'`), after a line naming the location and the variable that
chose it, and the engine exits 1, so supervisor's log tail names the path as a lab's would.

Resolution, read in the wheels SGLang 0.5.23 pins (METADATA: flashinfer-python 0.7.2, tilelang
0.1.12, apache-tvm-ffi 0.1.11, torch 2.14.1, transformers 5.19.0) and in triton 3.9.0:
- home: Python's os.path.expanduser("~") / pathlib.Path.home(): $HOME when set, else the passwd
  entry of the uid (supervisor 4.3 switches uid without setting HOME: REFERENCE.md).
- SGLang first: sglang/__init__.py calls srt/environ.py redirect_third_party_caches() before torch
  or FlashInfer load; it setdefaults TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, CUDA_CACHE_PATH,
  TILELANG_CACHE_DIR (<base>/triton, inductor, nv, tilelang) and FLASHINFER_WORKSPACE_BASE (<base>)
  from SGLANG_CACHE_DIR (default "~/.cache/sglang", not XDG-aware). So in a worker the libraries'
  own fallbacks below apply only to what that leaves unset. SGLang's JIT kernels:
  kernels/jit/utils/compile/cache.py cache_root() = SGLANG_JIT_CACHE_DIR, else ~/.cache/sglang/jit.
- Triton: triton/knobs.py cache_knobs.dir = TRITON_CACHE_DIR, else TRITON_HOME (default "~/") +
  ".triton/cache" (get_triton_dir).
- FlashInfer: flashinfer/jit/env.py FLASHINFER_BASE_DIR = FLASHINFER_WORKSPACE_BASE, else
  Path.home(); FLASHINFER_CACHE_DIR = base/.cache/flashinfer; FLASHINFER_JIT_DIR =
  <cache>/<version>/<arch>/cached_ops (_get_workspace_dir_name; compilation_context.py
  _normalize_cuda_arch gives "120f" for sm_120 on CUDA >= 12.9, SGLang's cu13 stack).
- TileLang: tilelang/env.py TILELANG_CACHE_DIR, else "~/.tilelang/cache"; TILELANG_TMP_DIR, else
  <cache>/tmp.
- TVM FFI (TileLang's and FlashInfer's kernel loader): tvm_ffi/cpp/extension.py build dir
  TVM_FFI_CACHE_DIR, else "~/.cache/tvm-ffi" (not XDG_CACHE_HOME).
- torch inductor: torch/_inductor/runtime/cache_dir_utils.py cache_dir() = TORCHINDUCTOR_CACHE_DIR,
  else default_cache_dir() = tempfile.gettempdir()/torchinductor_<getpass.getuser()>; getuser reads
  LOGNAME, USER, LNAME, USERNAME before the passwd entry, so a uid switch that keeps USER=root
  lands in root's /tmp/torchinductor_root.
- CUDA driver's JIT cache: CUDA_CACHE_PATH, else ~/.nv/ComputeCache; CUDA_CACHE_DISABLE=1 turns it
  off (NVIDIA CUDA C++ Programming Guide, "CUDA Environment Variables"; the driver is no wheel).
- XDG cache: XDG_CACHE_HOME, else ~/.cache (sglang/srt/model_loader/expert_pack_runtime.py,
  flashinfer's b12x compile cache); torch/utils/cpp_extension.py builds under TORCH_EXTENSIONS_DIR,
  else <XDG cache>/torch_extensions.
- Hugging Face: huggingface_hub/constants.py HF_HOME = HF_HOME, else XDG_CACHE_HOME/huggingface,
  else ~/.cache/huggingface; transformers/utils/hub.py HF_MODULES_CACHE = HF_MODULES_CACHE, else
  HF_HOME/modules, written by dynamic_module_utils.init_hf_modules under --trust-remote-code.

Limits:
- open files: sglang/srt/utils/common.py set_ulimit() (called by srt/entrypoints/engine.py) raises
  the soft RLIMIT_NOFILE to 65535 when the hard limit allows and only warns ("Fail to set
  RLIMIT_NOFILE: ...") when it does not; the engine does the same.
- locked memory: UCX's InfiniBand transports register (pin) the KV buffers; nixl-cu13 1.5.1's
  libuct_ib.so says "Please set max locked memory (ulimit -l) to 'unlimited'" when the limit is
  lower, and the registration fails. The engine demands an unlimited RLIMIT_MEMLOCK when it would
  use them: PD mode, --disaggregation-transfer-backend nixl with UCX (SGLANG_DISAGGREGATION_NIXL_BACKEND),
  UCX_TLS unset or naming an IB transport, and an InfiniBand device present (/sys/class/infiniband).
- /dev/shm: NCCL's SHM transport and torch multiprocessing put their segments there; the engine
  creates, writes and reads a file there and demands SHM_MIN_FREE_BYTES free (SGLang's Docker
  instructions run with --ipc host / --shm-size for this reason; Docker's default 64 MB is the
  classic failure).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import resource
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("pd_sim_worker")

FLASHINFER_VERSION = "0.7.2"
# flashinfer compilation_context._normalize_cuda_arch: (12, 0) on CUDA >= 12.9 -> "0f".
FLASHINFER_ARCH = "120f"
# sglang/srt/utils/common.py set_ulimit(target_soft_limit=65535).
SGLANG_NOFILE_TARGET = 65535
# A floor for /dev/shm: NCCL's SHM segments for a TP4 group plus torch's IPC handles; Docker's
# default 64 MiB fails, a host's tmpfs (half the RAM) passes.
SHM_MIN_FREE_BYTES = 1 << 30
# UCX transports that use an InfiniBand device (UCX_TLS names; "ib" is their alias).
IB_TRANSPORTS = frozenset(
    {
        "rc",
        "rc_v",
        "rc_x",
        "rc_verbs",
        "rc_mlx5",
        "dc",
        "dc_x",
        "dc_mlx5",
        "ud",
        "ud_v",
        "ud_x",
        "ud_verbs",
        "ud_mlx5",
        "ib",
        "all",
    }
)
PROBE_NAME = ".pd-sim-worker-probe"


class HostContractError(RuntimeError):
    """The host does not give this user what SGLang needs; the message names what and where."""


@dataclass(frozen=True)
class CacheLocation:
    """One place a library of the real engine writes at start-up, resolved as that library does."""

    key: str  # short name: triton, flashinfer, ...
    label: str  # what it is, for messages
    path: Path
    chosen_by: str  # the variable that chose it, or the fallback taken
    cite: str  # where the resolution is read
    jit: bool  # holds JIT-compiled kernels (a cold one costs compile time at start-up)


def home_dir(env: Mapping[str, str], uid: int | None = None) -> tuple[str, str]:
    """os.path.expanduser('~') as Python does it: $HOME when set, else the passwd entry of the uid."""
    if "HOME" in env:
        return env["HOME"], "HOME"
    uid = os.getuid() if uid is None else uid
    return pwd.getpwuid(uid).pw_dir, f"HOME unset: passwd entry of uid {uid}"


def _expand(value: str, home: str) -> str:
    """expanduser for a value that may start with '~' (the libraries expand their defaults)."""
    if value == "~" or value.startswith("~/"):
        return home + value[1:]
    return value


def user_name(env: Mapping[str, str], uid: int | None = None) -> str:
    """getpass.getuser(): LOGNAME, USER, LNAME, USERNAME, then the passwd entry."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if env.get(name):
            return env[name]
    return pwd.getpwuid(os.getuid() if uid is None else uid).pw_name


def temp_dir(env: Mapping[str, str]) -> str:
    """tempfile.gettempdir()'s first candidates: TMPDIR, TEMP, TMP, then /tmp."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        if env.get(name):
            return env[name]
    return tempfile.gettempdir() if env is os.environ else "/tmp"


def _pick(env: Mapping[str, str], name: str, default: str, fallback_note: str) -> tuple[str, str]:
    value = env.get(name)
    if value:
        return value, name
    return default, f"{name} unset: {fallback_note}"


# sglang 0.5.23 srt/environ.py third_party_cache_defaults(): what redirect_third_party_caches() (run by
# sglang/__init__.py before torch or FlashInfer load) setdefaults, under SGLANG_CACHE_DIR.
SGLANG_REDIRECTS = {
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "CUDA_CACHE_PATH": "nv",
    "TILELANG_CACHE_DIR": "tilelang",
    "FLASHINFER_WORKSPACE_BASE": "",
}


def sglang_environment(env: Mapping[str, str], home: str) -> tuple[dict[str, str], dict[str, str]]:
    """The environment after `import sglang`: SGLang's redirect of the third-party caches applied.

    Returns it and, for each variable the redirect set, how (for messages)."""
    base = _expand(env.get("SGLANG_CACHE_DIR") or "~/.cache/sglang", home)
    base_by = "SGLANG_CACHE_DIR" if env.get("SGLANG_CACHE_DIR") else "SGLANG_CACHE_DIR unset: ~/.cache/sglang"
    out, how = dict(env), {}
    for name, sub in SGLANG_REDIRECTS.items():
        if not out.get(name):  # os.environ.setdefault (an empty value counts as unset to the libraries)
            out[name] = os.path.join(base, sub) if sub else base
            how[name] = (
                f"{name} unset: sglang's redirect_third_party_caches -> {base_by}{'/' + sub if sub else ''}"
            )
    return out, how


def cache_locations(env: Mapping[str, str] | None = None, uid: int | None = None) -> list[CacheLocation]:
    """Every cache location of the real engine's libraries, resolved from `env` (default: ours) as a
    worker process resolves them: SGLang's redirect first, then each library's own rule."""
    env = os.environ if env is None else env
    home, home_by = home_dir(env, uid)
    env, redirected = sglang_environment(env, home)

    def pick(name: str, fallback: str, note: str) -> tuple[str, str]:
        value, by = _pick(env, name, fallback, note)
        return _expand(value, home), redirected.get(name, by)

    def under_home(rel: str) -> str:
        return os.path.join(home, rel)

    out: list[CacheLocation] = []

    def add(key: str, label: str, path: str, by: str, cite: str, jit: bool) -> None:
        out.append(CacheLocation(key, label, Path(path), by, cite, jit))

    base, by = pick("SGLANG_CACHE_DIR", under_home(".cache/sglang"), f"~/.cache/sglang ({home_by})")
    add("sglang", "SGLang's cache", base, by, "sglang 0.5.23 srt/environ.py SGLANG_CACHE_DIR", False)
    path, by = pick(
        "SGLANG_JIT_CACHE_DIR", under_home(".cache/sglang/jit"), f"~/.cache/sglang/jit ({home_by})"
    )
    add(
        "sglang-jit",
        "SGLang's JIT kernel cache",
        path,
        by,
        "sglang 0.5.23 kernels/jit/utils/compile/cache.py cache_root()",
        True,
    )
    triton_home = _expand(env.get("TRITON_HOME") or home, home)
    path, by = pick(
        "TRITON_CACHE_DIR", os.path.join(triton_home, ".triton", "cache"), "TRITON_HOME/.triton/cache"
    )
    add("triton", "Triton's kernel cache", path, by, "triton 3.9.0 triton/knobs.py cache_knobs.dir", True)
    fi_base, by = pick("FLASHINFER_WORKSPACE_BASE", home, f"Path.home() ({home_by})")
    fi_jit = os.path.join(fi_base, ".cache", "flashinfer", FLASHINFER_VERSION, FLASHINFER_ARCH, "cached_ops")
    add(
        "flashinfer",
        "FlashInfer's JIT workspace",
        fi_jit,
        by,
        "flashinfer 0.7.2 flashinfer/jit/env.py FLASHINFER_JIT_DIR",
        True,
    )
    tl_cache, by = pick("TILELANG_CACHE_DIR", under_home(".tilelang/cache"), f"~/.tilelang/cache ({home_by})")
    add(
        "tilelang",
        "TileLang's kernel cache",
        tl_cache,
        by,
        "tilelang 0.1.12 tilelang/env.py TILELANG_CACHE_DIR",
        True,
    )
    path, by = pick("TILELANG_TMP_DIR", os.path.join(tl_cache, "tmp"), "TILELANG_CACHE_DIR/tmp")
    add(
        "tilelang-tmp",
        "TileLang's temporary build directory",
        path,
        by,
        "tilelang 0.1.12 tilelang/env.py TILELANG_TMP_DIR",
        False,
    )
    path, by = pick("TVM_FFI_CACHE_DIR", under_home(".cache/tvm-ffi"), f"~/.cache/tvm-ffi ({home_by})")
    add(
        "tvm-ffi",
        "TVM FFI's extension build cache",
        path,
        by,
        "apache-tvm-ffi 0.1.11 tvm_ffi/cpp/extension.py (TVM_FFI_CACHE_DIR)",
        True,
    )
    user = re.sub(r'[\\/:*?"<>|]', "_", user_name(env, uid))
    path, by = pick(
        "TORCHINDUCTOR_CACHE_DIR",
        os.path.join(temp_dir(env), f"torchinductor_{user}"),
        "tempfile.gettempdir()/torchinductor_<getpass.getuser()>",
    )
    add(
        "inductor",
        "torch inductor's cache",
        path,
        by,
        "torch 2.14.1 torch/_inductor/runtime/cache_dir_utils.py cache_dir()",
        True,
    )
    xdg, xdg_by = pick("XDG_CACHE_HOME", under_home(".cache"), f"~/.cache ({home_by})")
    path, by = pick(
        "TORCH_EXTENSIONS_DIR", os.path.join(xdg, "torch_extensions"), "XDG_CACHE_HOME/torch_extensions"
    )
    add(
        "torch-extensions",
        "torch's C++ extension builds",
        path,
        by,
        "torch 2.14.1 torch/utils/cpp_extension.py _get_build_directory (TORCH_EXTENSIONS_DIR)",
        True,
    )
    if env.get("CUDA_CACHE_DISABLE") != "1":
        path, by = pick("CUDA_CACHE_PATH", under_home(".nv/ComputeCache"), f"~/.nv/ComputeCache ({home_by})")
        add(
            "cuda",
            "the CUDA driver's JIT cache",
            path,
            by,
            "CUDA C++ Programming Guide, CUDA Environment Variables (CUDA_CACHE_PATH)",
            True,
        )
    add(
        "xdg",
        "the XDG cache",
        xdg,
        xdg_by,
        "sglang 0.5.23 srt/model_loader/expert_pack_runtime.py (XDG_CACHE_HOME)",
        False,
    )
    hf_home, by = pick(
        "HF_HOME", os.path.join(xdg, "huggingface"), "XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface"
    )
    add(
        "hf-home",
        "the Hugging Face home",
        hf_home,
        by,
        "huggingface_hub 2.4.0 huggingface_hub/constants.py HF_HOME",
        False,
    )
    path, by = pick("HF_MODULES_CACHE", os.path.join(hf_home, "modules"), "HF_HOME/modules")
    add(
        "hf-modules",
        "transformers' remote-code module cache",
        path,
        by,
        "transformers 5.19.0 transformers/utils/hub.py HF_MODULES_CACHE",
        False,
    )
    return out


def probe(path: Path) -> OSError | None:
    """Create `path` (os.makedirs, as the libraries do), write a file there and read it back."""
    target = path / f"{PROBE_NAME}-{os.getpid()}"
    try:
        os.makedirs(path, exist_ok=True)
        target.write_bytes(b"pd-sim-worker host contract probe\n")
        if target.read_bytes() != b"pd-sim-worker host contract probe\n":
            return OSError(5, "Input/output error: read back differs", str(target))
    except OSError as exc:
        return exc
    finally:
        with contextlib.suppress(OSError):
            target.unlink()
    return None


def _who(env: Mapping[str, str]) -> str:
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = "?"
    return f"uid {uid} ({name})"


def check_caches(env: Mapping[str, str] | None = None) -> list[str]:
    """Probe every cache location; return the failures, each as two log lines (what, then the error)."""
    env = os.environ if env is None else env
    failures = []
    for loc in cache_locations(env):
        error = probe(loc.path)
        if error is not None:
            failures.append(
                f"{loc.label} at {loc.path} (chosen by {loc.chosen_by}; {loc.cite}) is not usable by "
                f"{_who(env)}\n{type(error).__name__}: {error}"
            )
    return failures


def raise_nofile() -> str | None:
    """SGLang's set_ulimit for open files: raise the soft limit to 65535 where the hard one allows.

    Returns SGLang's warning when it cannot (SGLang starts anyway, and so does the engine)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < SGLANG_NOFILE_TARGET:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (SGLANG_NOFILE_TARGET, hard))
        except ValueError as exc:
            return f"Fail to set RLIMIT_NOFILE: {exc}"
    return None


def uses_ib_transport(env: Mapping[str, str], role: str, transfer_backend: str | None) -> bool:
    """Whether UCX would open an InfiniBand transport for this worker's KV transfer."""
    if role not in ("prefill", "decode") or (transfer_backend or "mooncake") != "nixl":
        return False
    if env.get("SGLANG_DISAGGREGATION_NIXL_BACKEND", "UCX") != "UCX":
        return False
    tls = {t.strip().lstrip("^") for t in env.get("UCX_TLS", "all").split(",") if t.strip()}
    if env.get("UCX_TLS", "").startswith("^"):
        tls = {"all"}  # an exclusion list keeps the IB transports that it does not name
    if not tls & IB_TRANSPORTS:
        return False
    ib = Path(env.get("PD_SIM_SYSFS_INFINIBAND", "/sys/class/infiniband"))
    return ib.is_dir() and any(ib.iterdir())


def check_memlock(env: Mapping[str, str], role: str, transfer_backend: str | None) -> str | None:
    """UCX's IB transports pin the KV buffers: an unlimited RLIMIT_MEMLOCK when they are used."""
    if not uses_ib_transport(env, role, transfer_backend):
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return None
    return (
        f"UCX InfiniBand transport (UCX_TLS={env.get('UCX_TLS', '<unset: all>')}) cannot register the KV "
        f"buffers: Please set max locked memory (ulimit -l) to 'unlimited' (current: {soft // 1024} kbytes) "
        "(nixl-cu13 1.5.1 libuct_ib.so; LimitMEMLOCK=infinity in the supervisor unit)"
    )


def check_shm(path: Path = Path("/dev/shm"), min_free: int = SHM_MIN_FREE_BYTES) -> str | None:
    """/dev/shm must be writable by this user and have room for NCCL's and torch's segments."""
    error = probe(path)
    if error is not None:
        return f"{path} is not usable by uid {os.getuid()}\n{type(error).__name__}: {error}"
    stat = os.statvfs(path)
    free = stat.f_bavail * stat.f_frsize
    if free < min_free:
        return (
            f"{path} has {free / 2**20:.0f} MiB free, below the {min_free / 2**20:.0f} MiB NCCL's SHM "
            "transport and torch's IPC need\nRuntimeError: Error while creating shared memory segment "
            f"{path}/nccl-* (No space left on device)"
        )
    return None
