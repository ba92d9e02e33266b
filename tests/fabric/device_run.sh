#!/bin/sh
# The fabric checks on a real GPU host, in one command; everything lands in OUT, for
# tests/fabric/fixtures and benchmarks/results/fabric-*. Usage, from the checkout's root:
#   sh tests/fabric/device_run.sh OUT [SRC_GPU DST_GPU]
# PD_FABRIC_CASES="host-staged-shm host-staged-tcp" runs only the NIXL cases named (default: all).
# SRC/DST default to GPU 0 -> GPU 1 where two GPUs exist (the prefill -> decode pair on a 2-GPU
# box, issue 19), else GPU 0 -> GPU 0. NIXL must be importable (nixl-cu13 + nixl wheels on
# PYTHONPATH); nvidia-ml-py and torch with CUDA come with the GPU image.
set -u
out="${1:?output directory}"
mkdir -p "$out"
src="${2:-0}"
dst="${3:-$(python3 -c 'import torch; print(1 if torch.cuda.device_count() > 1 else 0)')}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
{
  echo "date_utc=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit=${PD_COMMIT:-unknown}"
  echo "src_gpu=$src dst_gpu=$dst"
  uname -r
  nvidia-smi -L
  python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
  grep -h "CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE *=" /usr/local/cuda/include/cuda.h 2>&1 | head -1
  command -v lspci || echo "lspci: not installed"
} >"$out/meta.txt" 2>&1
nvidia-smi -q -d MEMORY,PERFORMANCE >"$out/nvidia-smi-q.txt" 2>&1
nvidia-smi -q | sed -n '/PCI$/,/Bridge Chip/p' >>"$out/nvidia-smi-q.txt" 2>&1
nvidia-smi topo -m >"$out/nvidia-smi-topo.txt" 2>&1
nvidia-smi topo -p2p w >>"$out/nvidia-smi-topo.txt" 2>&1
python3 tests/fabric/record_nvml.py >"$out/nvml_fabric.json" 2>"$out/nvml_fabric.err"; echo "record_nvml rc=$?"
python3 src/pd_appliance/fabric/collect.py >"$out/snapshot.json" 2>"$out/snapshot.err"; echo "collect rc=$?"
cat /proc/cmdline >"$out/cmdline.txt"
check() {
  name="$1"; shift
  case " ${PD_FABRIC_CASES:-$name} " in *" $name "*) ;; *) return 0 ;; esac
  env "$@" timeout 150 python3 -m pd_appliance.nixl_check --json --src-gpu "$src" --dst-gpu "$dst" \
    --expect-transport cuda_ipc --min-gb-s 5 --size-mib 256 --iterations 10 \
    >"$out/nixl-$name.json" 2>"$out/nixl-$name.log"
  echo "nixl_check $name rc=$?"; tail -6 "$out/nixl-$name.log"
}
check default PD_FABRIC_CASE=default
check no-cuda-ipc UCX_TLS=^cuda_ipc
check expandable-segments PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
check serving-tls UCX_TLS=cuda_ipc,cuda_copy,sm,self,tcp
# Host-staged paths, what a prefill -> decode pair without P2P (across sockets) gets: UCX copies
# GPU -> host -> GPU with cuda_copy, then shared memory between the processes or TCP (NIXL needs a
# transport with peer failure handling for its active messages: sm alone cannot create UCX).
check host-staged-shm UCX_TLS=cuda_copy,sm,tcp,self
check host-staged-tcp UCX_TLS=cuda_copy,tcp,self
# Reference in the same run: torch copies (device to device on src -> dst, pinned host to device).
python3 - "$src" "$dst" >"$out/torch_reference.json" 2>&1 <<'PY'
import json, sys, time
import torch
src, dst = int(sys.argv[1]), int(sys.argv[2])
def timed(fn, n=10):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    for d in {src, dst}:
        torch.cuda.synchronize(d)
    return (time.perf_counter() - t) / n
size = 256 * 2**20
a = torch.empty(size, dtype=torch.uint8, device=f"cuda:{src}")
b = torch.empty(size, dtype=torch.uint8, device=f"cuda:{dst}")
h = torch.empty(size, dtype=torch.uint8).pin_memory()
d2d = timed(lambda: b.copy_(a))
h2d = timed(lambda: a.copy_(h, non_blocking=True))
peer = torch.cuda.can_device_access_peer(src, dst) if src != dst else None
print(json.dumps({"size_bytes": size, "d2d_gb_s": size / d2d / 1e9, "h2d_gb_s": size / h2d / 1e9,
                  "can_access_peer": peer, "src": src, "dst": dst}))
PY
echo "torch reference: $(cat "$out/torch_reference.json")"
