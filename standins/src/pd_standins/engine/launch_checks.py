"""What SGLang 0.5.23 refuses about the GPUs it is given and the model it is pointed at.

- GPUs: srt/entrypoints/engine.py (_launch_subprocesses) gives TP rank r the device
  base_gpu_id + r * gpu_id_step of those CUDA_VISIBLE_DEVICES leaves visible, and
  srt/model_executor/model_runner.py (ModelRunner.__init__) calls torch's set_device on it; a rank
  past the visible count fails there: SGLang logs "Context: self.device='cuda' get_device().gpu_id=..
  os.environ.get('CUDA_VISIBLE_DEVICES')=.. get_parallel().tp_rank=.. get_parallel().tp_size=.." and
  re-raises torch's "CUDA error: invalid device ordinal". More visible GPUs than ranks start fine in
  SGLang (the extra ones stay idle): the engine warns about those and starts.
  The simulated host has pd_standins.nvml.gpu_count() GPUs (PD_SIM_GPUS, default 8); CUDA reads
  CUDA_VISIBLE_DEVICES up to its first entry that names no device.
- Model: srt/models/registry.py resolves config.json's "architectures" to a model class;
  DeepseekV4ForCausalLM is srt/models/deepseek_v4.py's EntryClass. The rehearsal engine serves
  that one architecture and refuses others with the registry's ValueError ("Model architectures
  [...] are not supported for now. Supported architectures: ..."). A --model-path that is not a
  local directory is a Hub repository id to SGLang (downloaded, or refused offline): not checked.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from pd_standins.gpus import simulated_gpu
from pd_standins.nvml import gpu_count

log = logging.getLogger("pd_sim_worker")

SERVED_ARCHITECTURES = ("DeepseekV4ForCausalLM",)


class LaunchRefused(RuntimeError):
    """SGLang would fail to start with these GPUs or this model; the message is SGLang's (or torch's)."""


def visible_gpus(env: Mapping[str, str] | None = None, host_gpus: int | None = None) -> list[int]:
    """The host GPU indices CUDA makes visible, in order (CUDA_VISIBLE_DEVICES: indices or UUIDs)."""
    env = os.environ if env is None else env
    count = gpu_count() if host_gpus is None else host_gpus
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(count))
    uuids = {simulated_gpu(i)["uuid"]: i for i in range(count)}
    out: list[int] = []
    for entry in (e.strip() for e in raw.split(",")):
        index = int(entry) if entry.isdigit() else uuids.get(entry)
        if index is None or index >= count or index in out:
            break  # CUDA stops at the first entry that names no (new) device
        out.append(index)
    return out


def check_gpus(
    tp_size: int,
    base_gpu_id: int = 0,
    gpu_id_step: int = 1,
    env: Mapping[str, str] | None = None,
    host_gpus: int | None = None,
) -> list[int]:
    """The host GPU of each TP rank; LaunchRefused as SGLang's first rank past the visible ones fails."""
    env = os.environ if env is None else env
    visible = visible_gpus(env, host_gpus)
    if not visible:
        raise LaunchRefused("RuntimeError: No CUDA GPUs are available")
    wanted = [base_gpu_id + rank * gpu_id_step for rank in range(tp_size)]
    for rank, gpu_id in enumerate(wanted):
        if gpu_id >= len(visible):
            raise LaunchRefused(
                f"Context: self.device='cuda' get_device().gpu_id={gpu_id} "
                f"os.environ.get('CUDA_VISIBLE_DEVICES')={env.get('CUDA_VISIBLE_DEVICES')!r} "
                f"get_parallel().tp_rank={rank} get_parallel().tp_size={tp_size}\n"
                "torch.AcceleratorError: CUDA error: invalid device ordinal "
                f"({len(visible)} GPU(s) visible, --tp-size {tp_size} needs {max(wanted) + 1})"
            )
    if len(visible) > max(wanted) + 1:
        log.warning(
            "CUDA_VISIBLE_DEVICES=%s makes %d GPUs visible; --tp-size %d uses %d (the rest stay idle)",
            env.get("CUDA_VISIBLE_DEVICES", "<unset>"),
            len(visible),
            tp_size,
            len(wanted),
        )
    return [visible[i] for i in wanted]


def read_config(model_path: str | None) -> dict | None:
    """config.json of a local model directory; None for a Hub repository id (not a directory)."""
    if not model_path or not Path(model_path).is_dir():
        return None
    config = Path(model_path) / "config.json"
    try:
        return json.loads(config.read_text())
    except FileNotFoundError as exc:
        # transformers' AutoConfig on a local directory without config.json.
        raise LaunchRefused(
            f"OSError: {model_path} does not appear to have a file named config.json."
        ) from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise LaunchRefused(f"{type(exc).__name__}: {config}: {exc}") from exc


def check_architecture(model_path: str | None) -> dict | None:
    """The model's config.json (None for a Hub id); LaunchRefused when it is not the served architecture."""
    config = read_config(model_path)
    if config is None:
        return None
    architectures = config.get("architectures") or []
    if not any(arch in SERVED_ARCHITECTURES for arch in architectures):
        raise LaunchRefused(
            f"ValueError: Model architectures {architectures} are not supported for now. "
            f"Supported architectures: {set(SERVED_ARCHITECTURES)} (the rehearsal engine serves "
            f"{', '.join(SERVED_ARCHITECTURES)}; {model_path}/config.json)"
        )
    return config
