"""Benchmark: pd_appliance's split-KV sparse-MLA decode against SGLang 0.5.23's sm_120 Triton kernel.

Both run on the same GPU in one process, on the same inputs: DeepSeek-V4 decode with SWA top-k
128 + compressed top-k 512 on 256-token FP8 pages, attention sink on, B in {1, 4, 16, 64},
H in {16, 64}. Upstream's kernel is loaded from the pinned wheel (or from that one file copied
out of it) by path: nothing of it is in this repository.

    python3 benchmarks/sparse_mla_decode.py --upstream /path/to/sglang-0.5.23-...whl --out r.json

Per shape it prints eager and CUDA-graph-replay time per call for both, the ratio, and the
fraction of the floor: max(bytes / copy bandwidth, FLOPs / bf16 matmul rate), both ceilings
measured at the start of the run. Inputs rotate over several index sets spread over large page
pools, so timings are not of an L2-resident working set.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pd_kernels import sparse_mla_decode as smd
from pd_kernels.reference import (
    random_cache,
    random_indices,
    reference_decode,
    relative_error,
)

UPSTREAM_MEMBER = "sglang/kernels/ops/attention/flash_mla_sm120_triton.py"
SCALE = 512**-0.5
SWA_TOPK, EXTRA_TOPK, PAGE = 128, 512, 256


def load_upstream(path: Path):
    """Import upstream's flash_mla_sm120_triton from the wheel or from the file itself.

    The module imports only logging, torch and triton, so it loads on its own; a wheel's member is
    extracted to a temporary folder first.
    """
    if path.suffix == ".whl":
        tmp = Path(tempfile.mkdtemp(prefix="sglang-upstream-"))
        with zipfile.ZipFile(path) as wheel:
            wheel.extract(UPSTREAM_MEMBER, tmp)
        path = tmp / UPSTREAM_MEMBER
    spec = importlib.util.spec_from_file_location("upstream_flash_mla_sm120_triton", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}: pass the sglang 0.5.23 wheel or its {UPSTREAM_MEMBER}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure_ceilings() -> dict[str, float]:
    """Device-to-device copy bandwidth (read + write) and bf16 matmul rate on random data."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy_s = time_eager(lambda _i: dst.copy_(src), 1, reps=20)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_s = time_eager(lambda _i: a @ b, 1, reps=10)
    return {"copy_bytes_per_s": 2 * n / copy_s, "bf16_flops_per_s": 2 * 8192**3 / mm_s}


def time_eager(fn, nsets: int, reps: int, repeats: int = 5) -> float:
    """Median over `repeats` of (events around `reps` calls) / reps, seconds per call."""
    for i in range(nsets):
        fn(i)
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for r in range(reps):
            fn(r % nsets)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(samples)


def time_graph(fn, nsets: int, reps: int, repeats: int = 5) -> float:
    """One graph holding one call per input set; median replay time / nsets, seconds per call."""
    for i in range(nsets):
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(nsets):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _r in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / (reps * nsets))
    del graph
    return statistics.median(samples)


def make_sets(batch: int, heads: int, nsets: int, pools: tuple[torch.Tensor, torch.Tensor], seed: int):
    g = torch.Generator().manual_seed(seed)
    swa, extra = pools
    sink = torch.randn(heads, generator=g).cuda()
    sets = []
    for _ in range(nsets):
        sets.append(
            {
                "q": torch.randn(batch, 1, heads, 512, generator=g).to(torch.bfloat16).cuda(),
                "i1": random_indices(batch, SWA_TOPK, swa.shape[0] * PAGE, generator=g, device="cuda"),
                "i2": random_indices(batch, EXTRA_TOPK, extra.shape[0] * PAGE, generator=g, device="cuda"),
                "len2": torch.randint(EXTRA_TOPK // 2, EXTRA_TOPK + 1, (batch,), generator=g)
                .to(torch.int32)
                .cuda(),
                "sink": sink,
            }
        )
    return sets


def call_ours(pools, s, **kw):
    return smd.sparse_mla_decode(
        s["q"], pools[0], s["i1"], None, s["sink"], 512, SCALE, pools[1], s["i2"], s["len2"], **kw
    )


def call_upstream(upstream, pools, s):
    return upstream.flash_mla_sparse_decode_triton(
        s["q"], pools[0], s["i1"], None, s["sink"], 512, SCALE, pools[1], s["i2"], s["len2"]
    )


def reps_for(fn, nsets: int, budget_s: float = 0.05) -> int:
    one = time_eager(fn, nsets, reps=2, repeats=1)
    return max(3, min(200, int(budget_s / max(one, 1e-6))))


def measure_shape(upstream, pools, ceilings: dict[str, float], batch: int, heads: int, args) -> dict:
    """Errors vs float64, resources, eager and graph times, and the floor for one (B, H)."""
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    sets = make_sets(batch, heads, args.sets, pools, seed=batch * 1000 + heads)
    s0 = sets[0]
    ref_out, _ = reference_decode(
        s0["q"], pools[0], s0["i1"], None, s0["sink"], SCALE, pools[1], s0["i2"], s0["len2"]
    )
    ours_out, _ = call_ours(pools, s0)
    up_out, _ = call_upstream(upstream, pools, s0)
    row = {
        "batch": batch,
        "heads": heads,
        "err_ours": relative_error(ours_out, ref_out),
        "err_upstream": relative_error(up_out, ref_out),
        "config": smd.default_config(batch, heads, SWA_TOPK, EXTRA_TOPK, sm_count).__dict__,
        "resources": {
            name: {"shared": k.metadata.shared, "regs": k.n_regs, "spills": k.n_spills}
            for name, k in smd.LAST_LAUNCH.items()
        },
    }
    ours = lambda i: call_ours(pools, sets[i])  # noqa: E731
    ups = lambda i: call_upstream(upstream, pools, sets[i])  # noqa: E731
    r_ours, r_up = reps_for(ours, args.sets), reps_for(ups, args.sets)
    row["eager_ours_us"] = time_eager(ours, args.sets, r_ours) * 1e6
    row["eager_upstream_us"] = time_eager(ups, args.sets, r_up) * 1e6
    row["graph_ours_us"] = time_graph(ours, args.sets, max(3, r_ours // args.sets)) * 1e6
    row["graph_upstream_us"] = time_graph(ups, args.sets, max(3, r_up // args.sets)) * 1e6
    valid = SWA_TOPK + float(sum(s["len2"].float().mean().item() for s in sets) / len(sets))
    nbytes, flops = smd.floor_bytes_flops(batch, heads, int(valid), index_bytes_per_row=4 * 640)
    floor_s = max(nbytes / ceilings["copy_bytes_per_s"], flops / ceilings["bf16_flops_per_s"])
    row |= {"floor_bytes": nbytes, "floor_flops": flops, "floor_us": floor_s * 1e6}
    if args.sweep:
        row["sweep"] = {}
        # Split-KV variants are built by choose_config, two-phase ones by two_phase_config ("tp" keys).
        variants = {"splitkv": {}, "splitkv_pps4": {"programs_per_sm": 4}}
        for bn, bd, pbh, st in [] if args.sweep == "splitkv" else [
            (64, 64, 0, 1), (64, 32, 0, 1), (64, 16, 0, 1), (32, 32, 0, 1), (32, 16, 0, 1),
            (64, 32, 32, 1), (32, 32, 32, 1),
        ]:  # fmt: skip
            variants[f"tp_n{bn}_d{bd}_ph{pbh}_s{st}"] = {
                "block_n": bn, "block_d": bd, "pv_block_h": pbh, "num_stages": st,
            }  # fmt: skip
        for key, kw in variants.items():
            tiles = (SWA_TOPK + EXTRA_TOPK) // kw.get("block_n", 16)
            if key.startswith("tp"):
                cfg = smd.two_phase_config(heads, tiles, **kw)
            else:
                cfg = smd.choose_config(batch, heads, tiles, sm_count, **kw)
            out_v, _ = call_ours(pools, s0, config=cfg)
            fn = lambda i, c=cfg: call_ours(pools, sets[i], config=c)  # noqa: E731
            row["sweep"][key] = {
                "config": cfg.__dict__,
                "err": relative_error(out_v, ref_out),
                "resources": {
                    name: {"shared": k.metadata.shared, "regs": k.n_regs, "spills": k.n_spills}
                    for name, k in smd.LAST_LAUNCH.items()
                },
                "graph_us": time_graph(fn, args.sets, max(3, r_ours // args.sets)) * 1e6,
            }
    return row


def print_table(rows: list[dict]) -> None:
    print("B   H   | upstream eager / graph us | ours eager / graph us | speedup eager / graph"
          " | floor us | floor/ours graph | rel err ours / upstream")  # fmt: skip
    for r in rows:
        up_e, up_g, e, gr = (
            r["eager_upstream_us"],
            r["graph_upstream_us"],
            r["eager_ours_us"],
            r["graph_ours_us"],
        )
        print(
            f"{r['batch']:<3} {r['heads']:<3} | {up_e:10.1f} / {up_g:10.1f}   | {e:8.1f} / {gr:8.1f}   |"
            f" {up_e / e:7.1f}x / {up_g / gr:7.1f}x | {r['floor_us']:8.2f} | {r['floor_us'] / gr:15.1%} |"
            f" {r['err_ours']:.2e} / {r['err_upstream']:.2e}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", type=Path, required=True, help="sglang 0.5.23 wheel or its kernel file")
    parser.add_argument("--out", type=Path, help="write all numbers here as JSON")
    parser.add_argument("--batches", default="1,4,16,64")
    parser.add_argument("--heads", default="16,64")
    parser.add_argument("--sets", type=int, default=4, help="input sets rotated per measurement")
    parser.add_argument("--pool-pages", type=int, default=1024, help="256-token pages per cache pool")
    parser.add_argument(
        "--sweep",
        nargs="?",
        const="full",
        choices=["full", "splitkv"],
        help="also time other configurations (graph): all, or only the split-KV ones",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    upstream = load_upstream(args.upstream)
    g = torch.Generator().manual_seed(0)
    pools = (
        random_cache(args.pool_pages, PAGE, generator=g, device="cuda"),
        random_cache(args.pool_pages, PAGE, generator=g, device="cuda"),
    )
    ceilings = measure_ceilings()
    props = torch.cuda.get_device_properties(0)
    result = {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "ceilings": ceilings,
        "rows": [],
    }
    versions = f"torch {torch.__version__}, triton {result['triton']}"
    print(f"# {props.name}, {props.multi_processor_count} SMs, {versions}")
    tbps, tflops = ceilings["copy_bytes_per_s"] / 1e12, ceilings["bf16_flops_per_s"] / 1e12
    print(f"# copy {tbps:.2f} TB/s, bf16 matmul {tflops:.0f} TFLOP/s")
    for heads in [int(h) for h in args.heads.split(",")]:
        for batch in [int(b) for b in args.batches.split(",")]:
            row = measure_shape(upstream, pools, ceilings, batch, heads, args)
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print_table(result["rows"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
