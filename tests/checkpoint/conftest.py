"""Fixtures: a checkpoint written with the safetensors package, served by the rehearsal hub.

The rehearsal hub stands in for the Hugging Face Hub, which is unreachable here; everything on
the client side is the real huggingface_hub 2.4.0.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from pd_appliance.checkpoint import CheckpointRequest
from pd_standins.hub import RehearsalHub

REPO_ID = "nvidia/DeepSeek-V4-Flash-NVFP4"


def write_checkpoint(
    root: Path, *, shards: int = 3, extra_index_shard: str | None = None
) -> dict[str, list[str]]:
    """A real sharded safetensors checkpoint of about 3 MB; returns shard -> tensor names."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    weight_map: dict[str, str] = {}
    layout: dict[str, list[str]] = {}
    for number in range(1, shards + 1):
        name = f"model-{number:05d}-of-{shards:05d}.safetensors"
        tensors = {
            f"model.layers.{number}.mlp.experts.0.w1.weight": rng.integers(
                0, 255, (512, 1024), dtype=np.uint8
            ),
            f"model.layers.{number}.self_attn.q_proj.weight": rng.standard_normal((256, 256)).astype(
                np.float16
            ),
            f"model.layers.{number}.input_layernorm.weight": rng.standard_normal(256).astype(np.float32),
        }
        save_file(tensors, str(root / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        layout[name] = sorted(tensors)
    if extra_index_shard is not None:
        weight_map["model.layers.99.mlp.experts.0.w1.weight"] = extra_index_shard
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2)
    )
    (root / "config.json").write_text(
        json.dumps({"architectures": ["DeepseekV4ForCausalLM"], "hidden_size": 256})
    )
    return layout


@pytest.fixture
def checkpoint_writer() -> Callable[..., dict[str, list[str]]]:
    return write_checkpoint


@pytest.fixture
def repo_id() -> str:
    return REPO_ID


@pytest.fixture
def repo_dir(tmp_path: Path) -> Path:
    root = tmp_path / "hub-repo"
    write_checkpoint(root)
    return root


@pytest.fixture
def hub(repo_dir: Path) -> Iterator[RehearsalHub]:
    with RehearsalHub(repo_dir, REPO_ID, page_size=3) as server:
        yield server


@pytest.fixture
def make_request(tmp_path: Path) -> Callable[..., CheckpointRequest]:
    def build(endpoint: str, **overrides: object) -> CheckpointRequest:
        values: dict[str, object] = {
            "repo_id": REPO_ID,
            "revision": "main",
            "directory": tmp_path / "model",
            "endpoint": endpoint,
            "hash_workers": 2,
            "download_workers": 4,
        }
        values.update(overrides)
        return CheckpointRequest(**values)  # type: ignore[arg-type]

    return build
