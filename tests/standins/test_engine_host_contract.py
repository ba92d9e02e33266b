"""The rehearsal engine's host contract: SGLang's cache locations resolved as each library resolves them,
written and read as the user the engine runs as, and the failure SGLang would show, naming the path.

Permission failures need an unprivileged user: as root (CI containers) each such check runs in a
forked child that drops to nobody (os.setuid) before touching the paths; as another user, the
directories are simply not writable by it.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import pwd
import resource
import shutil
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pd_standins.engine import cli, host_contract
from pd_standins.engine.host_contract import cache_locations

NOBODY = 65534


def _paths(env: dict[str, str]) -> dict[str, Path]:
    return {loc.key: loc.path for loc in cache_locations(env)}


def test_each_library_falls_back_to_sglangs_redirect_then_the_home_directory() -> None:
    env = {"HOME": "/srv/home", "USER": "svc"}
    paths = _paths(env)
    # sglang/__init__.py points five library caches at SGLANG_CACHE_DIR (~/.cache/sglang) first.
    assert paths["sglang"] == Path("/srv/home/.cache/sglang")
    assert paths["triton"] == Path("/srv/home/.cache/sglang/triton")
    assert paths["flashinfer"] == Path("/srv/home/.cache/sglang/.cache/flashinfer/0.7.2/120f/cached_ops")
    assert paths["tilelang"] == Path("/srv/home/.cache/sglang/tilelang")
    assert paths["tilelang-tmp"] == Path("/srv/home/.cache/sglang/tilelang/tmp")
    assert paths["inductor"] == Path("/srv/home/.cache/sglang/inductor")
    assert paths["cuda"] == Path("/srv/home/.cache/sglang/nv")
    # The others use their own fallbacks.
    assert paths["sglang-jit"] == Path("/srv/home/.cache/sglang/jit")
    assert paths["tvm-ffi"] == Path("/srv/home/.cache/tvm-ffi")
    assert paths["torch-extensions"] == Path("/srv/home/.cache/torch_extensions")
    assert paths["xdg"] == Path("/srv/home/.cache")
    assert paths["hf-home"] == Path("/srv/home/.cache/huggingface")
    assert paths["hf-modules"] == Path("/srv/home/.cache/huggingface/modules")


def test_the_variables_take_precedence_as_in_each_library() -> None:
    env = {"HOME": "/h", "USER": "svc", "SGLANG_CACHE_DIR": "/sg", "FLASHINFER_WORKSPACE_BASE": "/fi",
           "TILELANG_CACHE_DIR": "/tl", "CUDA_CACHE_PATH": "/cc", "XDG_CACHE_HOME": "/x"}  # fmt: skip
    paths = _paths(env)
    assert paths["triton"] == Path("/sg/triton") and paths["inductor"] == Path("/sg/inductor")
    assert _paths({**env, "TRITON_CACHE_DIR": "/tc"})["triton"] == Path("/tc")
    assert paths["flashinfer"] == Path("/fi/.cache/flashinfer/0.7.2/120f/cached_ops")
    assert paths["tilelang"] == Path("/tl") and paths["tilelang-tmp"] == Path("/tl/tmp")
    assert paths["cuda"] == Path("/cc")
    assert "cuda" not in _paths({**env, "CUDA_CACHE_DISABLE": "1"})
    # XDG_CACHE_HOME moves the Hugging Face home and torch's extensions, not SGLang's or tvm-ffi's
    # caches (which expand ~/.cache themselves).
    assert paths["hf-home"] == Path("/x/huggingface") and paths["torch-extensions"] == Path(
        "/x/torch_extensions"
    )
    assert paths["tvm-ffi"] == Path("/h/.cache/tvm-ffi") and paths["sglang-jit"] == Path(
        "/h/.cache/sglang/jit"
    )
    assert _paths({**env, "HF_HOME": "/hf"})["hf-modules"] == Path("/hf/modules")
    assert _paths({**env, "SGLANG_CACHE_DIR": "~/sg"})["triton"] == Path("/h/sg/triton")


def test_without_home_the_passwd_entry_of_the_user_is_the_home() -> None:
    entry = pwd.getpwuid(os.getuid())
    locations = cache_locations({"USER": entry.pw_name})
    sglang = next(loc for loc in locations if loc.key == "sglang")
    assert sglang.path == Path(entry.pw_dir) / ".cache" / "sglang"
    assert f"passwd entry of uid {os.getuid()}" in sglang.chosen_by


def _as_unprivileged(fn: Callable[[], Any]) -> Any:
    """Run fn in a forked child as nobody (when we are root) and return its result (or raise its error)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read)
        try:
            if os.getuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            payload: Any = ("ok", fn())
        except BaseException as exc:
            payload = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        with os.fdopen(write, "wb") as pipe:
            pickle.dump(payload, pipe)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        kind, value = pickle.load(pipe)
    os.waitpid(pid, 0)
    if kind == "error":
        raise AssertionError(value)
    return value


@pytest.fixture
def open_tmp() -> Any:
    """A directory every user can traverse (pytest's tmp_path is private to its owner)."""
    path = Path(tempfile.mkdtemp(prefix="pd-host-contract-"))
    path.chmod(0o755)
    cli.load_flag_table()  # read now: the unprivileged child cannot import from root's Python
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def root_owned_home(open_tmp: Path) -> Path:
    """A home the unprivileged user cannot write: the appliance's root-owned /opt/pd-appliance."""
    home = open_tmp / "home"
    home.mkdir()
    home.chmod(0o755)
    return home


def test_a_home_the_user_cannot_write_fails_naming_the_path(root_owned_home: Path, open_tmp: Path) -> None:
    writable = open_tmp / "svc"
    writable.mkdir(mode=0o777)
    writable.chmod(0o777)
    env = {"HOME": str(root_owned_home), "USER": "svc", "TMPDIR": str(writable)}
    failures = _as_unprivileged(lambda: host_contract.check_caches(env))
    text = "\n".join(failures)
    # The first JIT compile's os.makedirs fails as it would in the library.
    assert f"PermissionError: [Errno 13] Permission denied: '{root_owned_home}/.cache'" in text
    assert f"FlashInfer's JIT workspace at {root_owned_home}/.cache/sglang/.cache/flashinfer" in text
    assert "chosen by FLASHINFER_WORKSPACE_BASE unset: sglang's redirect_third_party_caches" in text

    # The tree the serving role gives the service user (one variable each): all usable.
    tree = {
        name: str(writable / name)
        for name in (
            "SGLANG_CACHE_DIR",  # moves Triton, FlashInfer, TileLang, Inductor and CUDA's caches along
            "SGLANG_JIT_CACHE_DIR",
            "TVM_FFI_CACHE_DIR",
            "XDG_CACHE_HOME",  # moves the Hugging Face home and torch's extensions along
        )
    }
    assert _as_unprivileged(lambda: host_contract.check_caches({**env, **tree})) == []


def test_the_engine_exits_1_and_its_log_tail_names_the_path(root_owned_home: Path) -> None:
    """What supervisor's log tail shows for a worker whose home is root-owned (the lab's day 1)."""
    env = {**os.environ, "HOME": str(root_owned_home), "PD_SIM_JIT_COMPILE_S": "0"}
    for name in ("SGLANG_CACHE_DIR", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "XDG_CACHE_HOME"):
        env.pop(name, None)

    def run() -> tuple[int, str]:
        os.environ.clear()
        os.environ.update(env)
        stream = io.StringIO()
        logging.basicConfig(stream=stream, force=True, format="%(levelname)s %(message)s")
        status = cli.main(["--model-path", "m", "--port", "0", "--disaggregation-mode", "decode"])
        return status, stream.getvalue()

    status, output = _as_unprivileged(run)
    assert status == 1, output
    tail = output.strip().splitlines()
    assert any(
        line == f"ERROR PermissionError: [Errno 13] Permission denied: '{root_owned_home}/.cache'"
        for line in tail
    ), tail
    assert "Triton's kernel cache" in output and "triton/knobs.py" in output


def test_probe_writes_and_reads_back_and_cleans_up(tmp_path: Path) -> None:
    assert host_contract.probe(tmp_path / "a" / "b") is None
    assert list((tmp_path / "a" / "b").iterdir()) == []


def test_dev_shm_must_be_writable_and_roomy(open_tmp: Path) -> None:
    assert host_contract.check_shm(open_tmp, min_free=1) is None
    message = host_contract.check_shm(open_tmp, min_free=1 << 62)
    assert message and "No space left on device" in message and "MiB free" in message
    shut = open_tmp / "shm"
    shut.mkdir()
    shut.chmod(0o555)
    message = _as_unprivileged(lambda: host_contract.check_shm(shut, min_free=1))
    assert message and f"PermissionError: [Errno 13] Permission denied: '{shut}/" in message


def test_memlock_is_demanded_only_when_ucx_would_pin_memory_for_infiniband(tmp_path: Path) -> None:
    ib = tmp_path / "infiniband"
    ib.mkdir()
    env = {"PD_SIM_SYSFS_INFINIBAND": str(ib), "UCX_TLS": "rc,cuda_copy,cuda_ipc,sm,self,tcp"}
    assert host_contract.check_memlock(env, "decode", "nixl") is None  # no IB device: UCX opens none
    (ib / "mlx5_0").mkdir()
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    message = host_contract.check_memlock(env, "decode", "nixl")
    if soft == resource.RLIM_INFINITY:
        assert message is None
    else:
        assert message and "Please set max locked memory (ulimit -l) to 'unlimited'" in message
    one_host = {**env, "UCX_TLS": "cuda_ipc,cuda_copy,sm,self,tcp"}
    assert host_contract.check_memlock(one_host, "decode", "nixl") is None
    assert host_contract.check_memlock(env, "decode", "mooncake") is None
    assert host_contract.check_memlock(env, "null", "nixl") is None
    assert host_contract.uses_ib_transport({**env, "UCX_TLS": "^tcp"}, "prefill", "nixl")
    unset = {k: v for k, v in env.items() if k != "UCX_TLS"}
    assert host_contract.uses_ib_transport(unset, "prefill", "nixl")


def test_the_open_files_limit_is_raised_as_sglangs_set_ulimit_does() -> None:
    def run() -> tuple[str | None, int, int]:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        warning = host_contract.raise_nofile()
        return warning, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard

    warning, soft, hard = _as_unprivileged(run)
    if hard >= host_contract.SGLANG_NOFILE_TARGET:
        assert warning is None and soft == host_contract.SGLANG_NOFILE_TARGET
    else:  # SGLang only warns, and starts
        assert warning and warning.startswith("Fail to set RLIMIT_NOFILE:") and soft == 1024
