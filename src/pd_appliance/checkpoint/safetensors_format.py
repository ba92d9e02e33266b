"""Structural checks of .safetensors files and of the shard index, without loading any tensor.

A sha256 match proves the bytes are the Hub's bytes; these checks prove the bytes are a loadable
checkpoint: every header parses, every tensor's byte range fits its dtype and shape and lies
inside the file, the ranges tile the data section exactly (what the safetensors loader itself
demands), and the index names only shards that exist and tensors those shards hold. They read a
few MB per checkpoint, so they run on every play.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# Bits per element of every dtype the safetensors format defines (sub-byte types are packed).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
# The safetensors loader refuses headers above 100 MB; so do we, before allocating them.
MAX_HEADER_BYTES = 100_000_000
INDEX_SUFFIX = ".safetensors.index.json"


class SafetensorsFormatError(ValueError):
    """The file is not a complete, well-formed safetensors file; the message says where it breaks."""


@dataclass(frozen=True)
class SafetensorsSummary:
    """What the header says: tensor names and the byte count of the data section."""

    tensors: frozenset[str]
    header_bytes: int
    data_bytes: int
    # Bytes of each tensor's data (the roofline sums them by tensor group: pd_appliance.bench.roofline).
    tensor_bytes: Mapping[str, int] = field(default_factory=dict, compare=False)


def read_safetensors_summary(path: Path) -> SafetensorsSummary:
    """Parse the header of `path` and check that its tensors fit the file exactly."""
    file_size = path.stat().st_size
    if file_size < 8:
        raise SafetensorsFormatError(f"{file_size} bytes: too short for the 8-byte header length")
    with path.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        if header_len > MAX_HEADER_BYTES or 8 + header_len > file_size:
            raise SafetensorsFormatError(
                f"header length {header_len} does not fit a file of {file_size} bytes (truncated or not"
                " safetensors)"
            )
        raw = handle.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SafetensorsFormatError(f"header is not valid JSON: {err}") from err
    if not isinstance(header, dict):
        raise SafetensorsFormatError("header is not a JSON object")
    data_bytes = file_size - 8 - header_len
    ranges: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        ranges.append((*_tensor_range(name, entry, data_bytes), name))
    _check_tiling(ranges, data_bytes)
    return SafetensorsSummary(
        tensors=frozenset(name for *_, name in ranges),
        header_bytes=header_len,
        data_bytes=data_bytes,
        tensor_bytes={name: end - begin for begin, end, name in ranges},
    )


def _tensor_range(name: str, entry: object, data_bytes: int) -> tuple[int, int]:
    if not isinstance(entry, dict):
        raise SafetensorsFormatError(f"tensor {name!r}: header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise SafetensorsFormatError(f"tensor {name!r}: bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise SafetensorsFormatError(f"tensor {name!r}: bad data_offsets {offsets!r}")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise SafetensorsFormatError(f"tensor {name!r}: data_offsets {offsets} are not ordered")
    if end > data_bytes:
        raise SafetensorsFormatError(
            f"tensor {name!r} needs data bytes [{begin}, {end}) but the file holds only {data_bytes}"
            " (truncated)"
        )
    bits = DTYPE_BITS.get(str(dtype))
    if bits is None:
        raise SafetensorsFormatError(f"tensor {name!r}: unknown dtype {dtype!r}")
    needed = math.ceil(math.prod(shape) * bits / 8)
    if end - begin != needed:
        raise SafetensorsFormatError(
            f"tensor {name!r}: {dtype}{shape} needs {needed} bytes but data_offsets span {end - begin}"
        )
    return begin, end


def _check_tiling(ranges: list[tuple[int, int, str]], data_bytes: int) -> None:
    position = 0
    for begin, end, name in sorted(ranges):
        if begin != position:
            raise SafetensorsFormatError(
                f"tensor {name!r} starts at data byte {begin}, expected {position} (gap or overlap)"
            )
        position = end
    if position != data_bytes:
        raise SafetensorsFormatError(f"tensors cover {position} data bytes but the file has {data_bytes}")


def check_index(
    index_path: str,
    index_bytes: bytes,
    known_files: set[str],
    shard_tensors: dict[str, frozenset[str]],
    unselected: set[str] | None = None,
) -> tuple[list[str], list[str]]:
    """(problems, warnings) of a *.safetensors.index.json: shards not in the checkpoint, tensors not in them.

    `index_path` and `known_files` are repository paths ("/"-separated); shard names in the
    index are relative to the index's own folder. `shard_tensors` maps the shards that parsed
    to their tensor names. A shard in `unselected` (in the repository, left out by the
    download patterns on purpose) is a warning, not a problem.
    """
    unselected = unselected or set()
    try:
        index = json.loads(index_bytes)
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (ValueError, KeyError, TypeError) as err:
        return [f"{index_path}: not a safetensors index ({err})"], []
    folder = index_path.rpartition("/")[0]
    problems: list[str] = []
    warnings: list[str] = []
    missing: dict[str, int] = {}
    absent_tensors: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        shard_path = f"{folder}/{shard}" if folder else str(shard)
        if shard_path not in known_files:
            missing[shard_path] = missing.get(shard_path, 0) + 1
        elif shard_path in shard_tensors and tensor not in shard_tensors[shard_path]:
            absent_tensors.setdefault(shard_path, []).append(tensor)
    for shard_path, count in sorted(missing.items()):
        if shard_path in unselected:
            warnings.append(
                f"{index_path} maps {count} tensor(s) to {shard_path}, which the download patterns left out:"
                " this checkpoint cannot be loaded as is"
            )
            continue
        problems.append(
            f"{index_path} maps {count} tensor(s) to {shard_path}, which is not a file of the checkpoint"
        )
    for shard_path, tensors in sorted(absent_tensors.items()):
        problems.append(
            f"{index_path} maps {len(tensors)} tensor(s) to {shard_path} that its header does not hold"
            f" (first: {tensors[0]!r})"
        )
    return problems, warnings
