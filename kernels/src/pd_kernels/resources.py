"""Compile the decode kernel for a GPU architecture without a GPU and read its resources.

sm_120 (RTX PRO 6000) gives a program at most 99 KB of shared memory; spilled registers go to
local memory and cost bandwidth. Triton can compile for any target on a CPU-only machine (its
wheel bundles ptxas), so the budget is checked in CI for the exact launch configurations that
`choose_config` picks, not only on the lent H200 (whose sm_90 build differs: wgmma, more shared).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pd_kernels import sparse_mla_decode as smd

SM120_SHARED_LIMIT = 99 * 1024

_POINTERS = {
    "q_ptr": "*bf16",
    "idx1_ptr": "*i32",
    "len1_ptr": "*i32",
    "fp8_1": "*fp8e4nv",
    "u8_1": "*u8",
    "bf16_1": "*bf16",
    "idx2_ptr": "*i32",
    "len2_ptr": "*i32",
    "fp8_2": "*fp8e4nv",
    "u8_2": "*u8",
    "bf16_2": "*bf16",
    "sink_ptr": "*fp32",
    "out_ptr": "*bf16",
    "lse_ptr": "*fp32",
    "mid_o_ptr": "*fp32",
    "mid_lse_ptr": "*fp32",
    "s_ptr": "*fp32",
}
# Integer arguments that are multiples of 16 in SGLang's calls (Triton specializes those at launch).
_ALIGNED_INTS = {
    "q_stride_r", "q_stride_h", "idx1_stride", "idx2_stride", "topk1", "topk2",
    "page_size1", "page_bytes1", "scale_off1", "page_size2", "page_bytes2", "scale_off2",
    "out_stride_r", "out_stride_h",
}  # fmt: skip


@dataclass(frozen=True)
class KernelResources:
    """What ptxas and Triton report for one compiled variant."""

    arch: int
    shared_bytes: int
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_frame_bytes: int


def _ptxas() -> str:
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for name in ("ptxas-blackwell", "ptxas"):
        path = os.path.join(bin_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"no ptxas in {bin_dir}: install a Triton wheel that bundles it")


def compile_split_kernel(
    arch: int, config: smd.LaunchConfig, *, final: bool, has_extra: bool = True, has_sink: bool = True
) -> KernelResources:
    """Compile _split_kernel for sm_<arch> with `config` and report its shared memory and registers."""
    constexprs = {
        "HAS_LEN1": True,
        "HAS_EXTRA": has_extra,
        "HAS_LEN2": has_extra,
        "HAS_SINK": has_sink,
        "FINAL": final,
        "BLOCK_H": config.block_h,
        "BLOCK_N": config.block_n,
        "DOT_DTYPE": tl.bfloat16,
        "EMULATE_RNE": False,
    }
    return _compile(arch, smd._split_kernel, constexprs, config.num_warps, config.num_stages)


def compile_two_phase_kernels(
    arch: int, config: smd.LaunchConfig, *, has_extra: bool = True, has_sink: bool = True
) -> dict[str, KernelResources]:
    """Compile the two-phase path's _scores_kernel and _pv_kernel for sm_<arch> with `config`."""
    flags = {"HAS_LEN1": True, "HAS_EXTRA": has_extra, "HAS_LEN2": has_extra, "BLOCK_N": config.block_n}
    flags["DOT_DTYPE"] = tl.bfloat16
    scores = {**flags, "BLOCK_H": config.block_h}
    pv = {**flags, "BLOCK_H": config.pv_block_h or config.block_h, "HAS_SINK": has_sink}
    pv |= {"BLOCK_D": config.block_d, "EMULATE_RNE": False}
    return {
        "scores": _compile(arch, smd._scores_kernel, scores, config.num_warps, config.num_stages),
        "pv": _compile(arch, smd._pv_kernel, pv, config.pv_warps, config.num_stages),
    }


def _compile(
    arch: int, fn: Any, constexprs: dict[str, Any], num_warps: int, num_stages: int
) -> KernelResources:
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in _POINTERS:
            signature[name] = _POINTERS[name]
        elif name == "qk_scale_log2":
            signature[name] = "fp32"
        elif name.startswith("page_bytes"):
            signature[name] = "i64"
        else:
            signature[name] = "i32"
    aligned = set(_POINTERS) | _ALIGNED_INTS
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned if n in fn.arg_names}
    kernel = triton.compile(
        ASTSource(fn, signature, constexprs, attrs),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        done = subprocess.run(
            [_ptxas(), "-v", f"--gpu-name={gpu}", "-o", os.devnull, ptx],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"ptxas failed for sm_{arch}: {done.stderr[-2000:]}")
    report = done.stderr

    def number(pattern: str) -> int:
        found = re.findall(pattern, report)
        return max((int(x) for x in found), default=0)

    return KernelResources(
        arch=arch,
        shared_bytes=int(kernel.metadata.shared),
        registers=number(r"Used (\d+) registers"),
        spill_store_bytes=number(r"(\d+) bytes spill stores"),
        spill_load_bytes=number(r"(\d+) bytes spill loads"),
        stack_frame_bytes=number(r"(\d+) bytes stack frame"),
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m pd_kernels.resources --arch 120 --rows 1 --heads 64`: JSON per variant.

    A separate process, because a process that set TRITON_INTERPRET=1 holds interpreted kernels
    that cannot be compiled.
    """
    import argparse
    import dataclasses
    import json

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--arch", type=int, default=120)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--tiles", type=int, default=40)
    parser.add_argument("--sm-count", type=int, default=188)
    parser.add_argument("--block-h", type=int, default=16)
    parser.add_argument("--block-n", type=int, default=16)
    parser.add_argument("--num-warps", type=int, default=4)
    parser.add_argument("--final-only", action="store_true")
    args = parser.parse_args(argv)
    config = smd.choose_config(
        args.rows, args.heads, args.tiles, args.sm_count,
        block_h=args.block_h, block_n=args.block_n, num_warps=args.num_warps,
    )  # fmt: skip
    for final in (True,) if args.final_only else (False, True):
        res = compile_split_kernel(args.arch, config, final=final)
        kernel = "split_final" if final else "split"
        print(json.dumps({"kernel": kernel, "config": dataclasses.asdict(config), **dataclasses.asdict(res)}))
    if not args.final_only:
        # The two-phase path's default configurations (64 and 16 heads; see default_config).
        for heads in (64, 16):
            tp = smd.default_config(64, heads, 128, 512, args.sm_count)
            for name, res in compile_two_phase_kernels(args.arch, tp).items():
                row = {
                    "kernel": f"{name}_h{heads}",
                    "config": dataclasses.asdict(tp),
                    **dataclasses.asdict(res),
                }
                print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
