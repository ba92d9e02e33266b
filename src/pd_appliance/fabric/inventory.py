"""Fabric checks on the inventory alone: what the PD workers' environment would do to NIXL.

- expandable_segments: memory PyTorch allocates with `expandable_segments:True` (CUDA VMM,
  cuMemCreate) cannot be exported with the legacy CUDA IPC handle UCX's cuda_ipc needs, so NIXL
  falls back to TCP without a word (NIXL issue 1754, PR 1755): on the lent H200 the same write
  ran at 0.41 GB/s instead of 796 GB/s (benchmarks/results/fabric-h200-2026-12-03.md). DeepSeek-V4
  sm_120 recipes often set it; any worker env hook that does fails here.
- ucx_net_devices: with prefill and decode on different hosts, KV crosses the network; without
  UCX_NET_DEVICES (or the IB device) pinned, UCX may pick an interface the peer cannot reach and
  NIXL hangs until its 300 s timeout (sglang PR 28737).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pd_appliance.fabric.findings import Finding

# PyTorch reads PYTORCH_ALLOC_CONF (2.9+) and the older PYTORCH_CUDA_ALLOC_CONF.
ALLOC_CONF_NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
TRUE_WORDS = ("true", "1", "yes")
EXPANDABLE_FIX = (
    "remove expandable_segments:True from the PD workers' env hooks (set the variable to null in the "
    "hook that adds it); KV memory must come from cudaMalloc for UCX's cuda_ipc"
)
NET_FIX = (
    "set serving_ucx_net_devices to the NIC the peer reaches (e.g. 'mlx5_0:1' for RDMA or 'eth1' for "
    "TCP; `ucx_info -d` lists them) or serving_ib_device, in group_vars for the prefill and decode hosts"
)


def expandable_segments(conf: str) -> bool:
    """Whether an allocator configuration ("a:b,c:d") turns expandable segments on."""
    for option in str(conf).split(","):
        key, _, value = option.partition(":")
        if key.strip() == "expandable_segments" and value.strip().lower() in TRUE_WORDS:
            return True
    return False


def expandable_findings(sources: Mapping[str, Mapping[str, Any] | None], host: str) -> list[Finding]:
    """Env hooks (name of the variable -> its dict) that give a worker expandable segments."""
    found = []
    for source, env in sources.items():
        for name in ALLOC_CONF_NAMES:
            value = (env or {}).get(name)
            if value is not None and expandable_segments(value):
                found.append(
                    Finding(
                        "expandable_segments",
                        host,
                        f"{source}.{name}",
                        f"{name}={value} gives the PD workers VMM memory that UCX cannot share by "
                        "cuda_ipc: NIXL silently moves KV over TCP.",
                        EXPANDABLE_FIX,
                    )
                )
    return found


def worker_env_sources(values: Mapping[str, Any]) -> dict[str, Mapping[str, Any] | None]:
    """The env dicts a PD worker receives, by the variable that holds them.

    `values` holds serving_env_common/prefill/decode/host, serving_env_file_vars and
    validation_variants (whose env_hooks are merged over the deployed ones during A/B runs).
    """
    sources = {
        name: values.get(name)
        for name in (
            "serving_env_common",
            "serving_env_prefill",
            "serving_env_decode",
            "serving_env_aggregated",
            "serving_env_host",
            "serving_env_file_vars",
        )
    }
    for variant in values.get("validation_variants") or []:
        hooks = variant.get("env_hooks") or {}
        for role in ("common", "prefill", "decode", "aggregated"):
            sources[f"validation_variants[{variant.get('name', '?')}].env_hooks.{role}"] = hooks.get(role)
    return sources


def net_device_findings(
    host: str,
    groups: Mapping[str, Iterable[str]],
    values: Mapping[str, Any],
) -> list[Finding]:
    """A worker host whose KV peer is another host, with no NIC pinned for UCX."""
    prefill = set(groups.get("prefill") or [])
    decode = set(groups.get("decode") or [])
    peers = set()
    if host in prefill:
        peers |= decode - {host}
    if host in decode:
        peers |= prefill - {host}
    if not peers:
        return []
    pinned = bool(values.get("serving_ucx_net_devices")) or bool(values.get("serving_ib_device"))
    for source in worker_env_sources(values).values():
        pinned = pinned or bool((source or {}).get("UCX_NET_DEVICES"))
    if pinned:
        return []
    return [
        Finding(
            "ucx_net_devices",
            host,
            "serving_ucx_net_devices",
            f"KV moves between this host and {', '.join(sorted(peers))} over the network, and neither "
            "serving_ucx_net_devices, serving_ib_device nor a UCX_NET_DEVICES env hook names the NIC: "
            "NIXL can hang until its 300 s timeout.",
            NET_FIX,
        )
    ]


def role_gpus(instances: Any, role: str) -> list[int]:
    """The GPUs of this host's serving instances of `role`, in order, each once.

    smg pairs any prefill instance with any decode instance (it picks each side on its own), so
    the fabric checks judge every GPU of every prefill instance against every GPU of every decode
    instance. Malformed entries are skipped: preflight's topology check reports them.
    """
    found: list[int] = []
    for instance in instances if isinstance(instances, list) else []:
        if not isinstance(instance, Mapping) or instance.get("role") != role:
            continue
        for gpu in instance.get("gpus") or []:
            try:
                index = int(gpu)
            except (TypeError, ValueError):
                continue
            if index not in found:
                found.append(index)
    return found


def inventory_findings(
    host: str, groups: Mapping[str, Iterable[str]], values: Mapping[str, Any]
) -> list[Finding]:
    """Both inventory checks for one host (a worker host; the router's env is not a worker's)."""
    if host not in set(groups.get("prefill") or []) | set(groups.get("decode") or []):
        return []
    return expandable_findings(worker_env_sources(values), host) + net_device_findings(host, groups, values)
