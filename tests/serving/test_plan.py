"""pd_appliance.serving.plan: each program's argv, environment and notes from the role's variables.

tests/serving/test_lab_render.py renders the whole role for the lab layouts; these check the planner
alone, branch by branch: the launcher before numactl before the engine, the env layers' order, the
NUMA notes, and the router's wait for every worker.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_pinning_and_commands import SETTINGS

from pd_appliance.serving import pinning
from pd_appliance.serving.commands import CommandError
from pd_appliance.serving.plan import program_specs

LAUNCHER = ["/opt/tools/bin/python", "-m", "pd_appliance.serving.launch"]
FACTS = [{"index": i, "numa_node": i // 4} for i in range(8)]


def instance(name: str, role: str, gpus: list[int], port: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "role": role, "gpus": gpus, "tp_size": len(gpus), "port": port,
            "bootstrap_port": 8998 if role == "prefill" else None, "env": {}, "extra_args": [],
            "url": f"http://10.0.0.5:{port}", "host": "node1", **extra}  # fmt: skip


# sglang_argv's keys that each instance (or the planner) sets, not a variable of the role.
INSTANCE_KEYS = (
    "tp_size",
    "host",
    "port",
    "bootstrap_port",
    "cuda_graph_max_bs",
    "speculative",
    "extra_args",
)
# The role's serving_* variables as the planner gets them (check_inputs.yml gathers them by prefix).
SETTINGS_VARS: dict[str, Any] = {
    **{f"serving_{key}": value for key, value in SETTINGS.items() if key not in INSTANCE_KEYS},
    "serving_worker_bind_host": "127.0.0.1", "serving_bootstrap_port": 8998,
    **{f"serving_speculative_{key}": value for key, value in SETTINGS["speculative"].items()},
    "serving_env_dir": "/etc/pd/env", "serving_log_dir": "/var/log/pd",
    "serving_engine_command": ["/opt/sglang/bin/python", "-m", "sglang.launch_server"],
    "serving_prefill_cuda_graph_max_bs": None, "serving_decode_cuda_graph_max_bs": 32,
    "serving_prefill_extra_args": [], "serving_decode_extra_args": [["--decode-log-interval", "40"]],
    "serving_aggregated_extra_args": [], "serving_router_extra_args": [],
    "serving_numactl_path": "/usr/bin/numactl", "serving_numa_binding": True,
    "serving_worker_require_api_key": False,
    "serving_worker_priority": 100, "serving_worker_startsecs": 30, "serving_worker_stopwaitsecs": "60",
    "serving_router_priority": 200, "serving_router_startsecs": 5, "serving_router_stopwaitsecs": 30,
    "serving_env_defaults_common": {"A": "defaults"}, "serving_env_common": {"A": "common", "B": "common"},
    "serving_env_defaults_workers": {"W": "workers"}, "serving_env_defaults_router": {"R": "router-default"},
    "serving_env_router": {"R": "router"}, "serving_env_host": {"B": "host"},
    "serving_sglang_sm120_flashmla_backend": "triton",
    "serving_env_prefill": {}, "serving_env_decode": {"W": "decode-user"}, "serving_env_aggregated": {},
    "serving_router_command": ["/opt/router/bin/smg", "launch"],
    "serving_router_host": "127.0.0.1", "serving_router_port": 8000, "serving_router_policy": "round_robin",
    "serving_router_aggregated_policy": "round_robin", "serving_router_metrics_port": None,
    "serving_router_worker_outage_grace_s": None, "serving_log_level": None,
    "serving_worker_health_path": "/health", "serving_router_discovery_file": "/srv/pd/router-workers.json",
}  # fmt: skip


def inputs(
    instances: list[dict[str, Any]], facts: list[dict[str, Any]] = FACTS, **over: Any
) -> dict[str, Any]:
    """The role's inputs for `instances`; `over` sets serving_* variables, or the other inputs by name."""
    bindings = {i["name"]: pinning.gpu_binding(i["gpus"], facts) for i in instances}
    settings = {**SETTINGS_VARS, **{k: v for k, v in over.items() if k.startswith("serving_")}}
    return {
        "settings": settings, "tools_python": LAUNCHER[0], "instances": instances, "bindings": bindings,
        "health_urls": {**{i["name"]: f"http://127.0.0.1:{i['port']}/health" for i in instances},
                        "router": "http://127.0.0.1:8000/readiness"},
        "all_instances": instances, **{k: v for k, v in over.items() if not k.startswith("serving_")},
    }  # fmt: skip


LAB = [instance("prefill", "prefill", [0, 1, 2, 3], 30000), instance("decode", "decode", [4, 5, 6, 7], 30001)]


def test_a_worker_is_launcher_then_numactl_then_the_engine_with_its_layers_in_order() -> None:
    decode = program_specs(["decode"], inputs(LAB))["decode"]
    argv = decode["argv"]
    assert argv[: len(LAUNCHER) + 2] == [*LAUNCHER, "--env-file=/etc/pd/env/decode.env", "--"]
    assert argv[len(LAUNCHER) + 2 : len(LAUNCHER) + 6] == [
        "/usr/bin/numactl", "--cpunodebind=1", "--membind=1", "--"
    ]  # fmt: skip
    engine = argv[len(LAUNCHER) + 6 :]
    assert engine[:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]
    assert engine[engine.index("--cuda-graph-max-bs-decode") + 1] == "32"
    assert engine[-2:] == ["--decode-log-interval", "40"]
    # common over its defaults, the host over common, the role's own switch, the user's decode hook
    # over the workers' defaults, and the pinning last.
    assert decode["environment"] == {
        "A": "common", "B": "host", "W": "decode-user", "SGLANG_SM120_FLASHMLA_BACKEND": "triton",
        "CUDA_VISIBLE_DEVICES": "4,5,6,7",
    }  # fmt: skip
    assert (decode["priority"], decode["startsecs"], decode["stopwaitsecs"]) == (100, 30, 60)
    assert decode["log"] == "/var/log/pd/decode.log" and decode["health_url"].endswith(":30001/health")
    assert decode["notes"] == [
        "decode instance, TP4, port 30001 (serving_instances)",
        "GPUs 4,5,6,7 (CUDA_VISIBLE_DEVICES)",
        "NUMA node(s) 1: /usr/bin/numactl --cpunodebind=1 --membind=1 -- (CPU and memory binding)",
    ]


def test_numa_notes_say_why_a_worker_is_not_bound() -> None:
    unbound = program_specs(["prefill"], inputs(LAB, serving_numa_binding=False))["prefill"]
    assert "/usr/bin/numactl" not in unbound["argv"]
    assert unbound["notes"][2:] == ["no NUMA binding (serving_numa_binding is false); NUMA node(s) 0"]
    assert unbound["notes"][0] == "prefill instance, TP4, port 30000, bootstrap port 8998 (serving_instances)"
    no_node = program_specs(["prefill"], inputs(LAB, facts=[{"index": i, "numa_node": -1} for i in range(8)]))
    assert no_node["prefill"]["notes"][-1] == "no NUMA binding: the facts give no NUMA node for GPUs 0,1,2,3"
    spanning = [instance("prefill", "prefill", [2, 3, 4, 5], 30000)]
    notes = program_specs(["prefill"], inputs(spanning))["prefill"]["notes"]
    assert notes[-1] == "WARNING: these GPUs span NUMA nodes 0,1; pick GPUs of one node for local memory"


def test_a_worker_takes_the_router_key_only_when_workers_require_it() -> None:
    open_ = program_specs(["prefill"], inputs(LAB))["prefill"]["argv"]
    keyed = program_specs(["prefill"], inputs(LAB, serving_worker_require_api_key=True))["prefill"]["argv"]
    secret = "--secret-arg=--api-key=SERVING_ROUTER_API_KEY"
    assert secret not in open_ and keyed.index(secret) < keyed.index("--")


def test_the_router_reads_its_workers_from_the_discovery_file_and_its_key_from_the_env_file() -> None:
    second = instance("decode-1", "decode", [4, 5], 30002, url="http://10.0.0.6:30002", host="node2")
    router = program_specs(["router"], inputs([*LAB, second]))["router"]
    argv = router["argv"]
    assert argv[len(LAUNCHER) : argv.index("--")] == [
        "--env-file=/etc/pd/env/router.env", "--secret-arg=--api-key=SERVING_ROUTER_API_KEY",
    ]  # fmt: skip
    assert argv[argv.index("--") + 1 : argv.index("--") + 7] == [
        "/opt/router/bin/smg", "launch", "--pd-disaggregation",
        "--discovery-provider", "file", "--discovery-file",
    ]  # fmt: skip
    assert router["environment"] == {"A": "common", "B": "host", "R": "router"}
    assert router["notes"][0].startswith("smg PD router over the workers of /srv/pd/router-workers.json")
    assert "gpus" not in router and router["priority"] == 200
    # A fleet change (a host more or less) leaves the router's program as it is: no restart.
    assert program_specs(["router"], inputs(LAB))["router"] == router


def test_a_bad_setting_is_the_commands_refusal() -> None:
    bad = inputs(LAB, serving_speculative_algorithm="NEXTN")
    with pytest.raises(CommandError, match="EAGLE"):
        program_specs(["prefill"], bad)


def test_health_urls_dial_targets_and_release_programs_of_a_host() -> None:
    from pd_appliance.serving import plan

    urls = plan.health_urls(LAB, "10.0.0.5", "/health", "http://127.0.0.1:8000/readiness")
    assert urls == {"router": "http://127.0.0.1:8000/readiness", "prefill": "http://10.0.0.5:30000/health",
                    "decode": "http://10.0.0.5:30001/health"}  # fmt: skip
    assert plan.worker_base_urls(LAB, "fd00::5") == {"prefill": "http://[fd00::5]:30000",
                                                     "decode": "http://[fd00::5]:30001"}  # fmt: skip
    assert plan.dial_targets(LAB) == [
        "pd:prefill@node1=10.0.0.5:30000",
        "bootstrap of pd:prefill@node1=10.0.0.5:8998",
        "pd:decode@node1=10.0.0.5:30001",
    ]
    specs = program_specs(["prefill", "router"], inputs(LAB))
    assert plan.release_programs(specs) == {
        "prefill": {"role": "prefill", "health_url": "http://127.0.0.1:30000/health"},
        "router": {"role": "router", "health_url": "http://127.0.0.1:8000/readiness"},
    }


AGG = [
    instance(f"aggregated-{i}", "aggregated", gpus, 30000 + i)
    for i, gpus in enumerate([[0, 1, 2, 3], [4, 5, 6, 7]])
]


def aggregated_inputs(**over: Any) -> dict[str, Any]:
    return inputs(
        AGG,
        serving_prefill_cuda_graph_max_bs=8,
        serving_aggregated_extra_args=[["--enable-mixed-chunk"]],
        serving_env_aggregated={"W": "aggregated-user"},
        serving_router_aggregated_policy="cache_aware",
        **over,
    )


def test_aggregated_instances_are_one_engine_each_and_the_router_runs_in_regular_mode() -> None:
    specs = program_specs(["aggregated-0", "aggregated-1", "router"], aggregated_inputs())
    first = specs["aggregated-0"]
    engine = first["argv"][first["argv"].index("sglang.launch_server") + 1 :]
    assert not [w for w in engine if w.startswith("--disaggregation")]
    assert engine[engine.index("--cuda-graph-max-bs-prefill") + 1] == "8"
    assert engine[engine.index("--cuda-graph-max-bs-decode") + 1] == "32"
    assert engine[-1] == "--enable-mixed-chunk"  # the aggregated role's own extra args, not decode's
    assert first["environment"] == {
        "A": "common", "B": "host", "W": "aggregated-user", "SGLANG_SM120_FLASHMLA_BACKEND": "triton",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }  # fmt: skip
    assert first["role"] == "aggregated" and first["notes"][0] == (
        "aggregated instance, TP4, port 30000 (serving_instances)"
    )
    router = specs["router"]["argv"]
    smg = router[router.index("--") + 1 :]
    assert smg[:6] == ["/opt/router/bin/smg", "launch", "--discovery-provider", "file", "--discovery-file",
                       "/srv/pd/router-workers.json"]  # fmt: skip
    assert "--pd-disaggregation" not in smg and smg[smg.index("--policy") + 1] == "cache_aware"
    assert specs["router"]["notes"][0].startswith(
        "smg regular mode (cache_aware) over the workers of /srv/pd/router-workers.json"
    )


def test_aggregated_health_dial_targets_and_release_programs() -> None:
    from pd_appliance.serving import plan

    assert plan.dial_targets(AGG) == [
        "pd:aggregated-0@node1=10.0.0.5:30000",
        "pd:aggregated-1@node1=10.0.0.5:30001",
    ]
    assert plan.health_urls(AGG, "10.0.0.5", "/health", "http://r/readiness")["aggregated-1"] == (
        "http://10.0.0.5:30001/health"
    )
    specs = program_specs(["aggregated-1"], aggregated_inputs())
    assert plan.release_programs(specs) == {
        "aggregated-1": {"role": "aggregated", "health_url": "http://127.0.0.1:30001/health"}
    }


def test_a_router_over_a_mix_of_aggregated_and_pd_instances_is_refused() -> None:
    mixed = aggregated_inputs(all_instances=[*AGG, *LAB])
    with pytest.raises(CommandError, match="the router has one mode"):
        program_specs(["router"], mixed)


def test_the_planner_reads_each_setting_by_its_variables_name() -> None:
    """Every serving_* variable reaches the command lines without a line in the role's vars/: the
    engine's as its name without `serving_`, the router's without `serving_router_`."""
    specs = program_specs(
        ["decode", "router"],
        inputs(LAB, serving_kv_cache_dtype="fp8_e5m2", serving_router_queue_size=7,
               serving_router_metrics_port=29000, serving_sglang_sm120_flashmla_backend=""),
    )  # fmt: skip
    decode, router = specs["decode"]["argv"], specs["router"]["argv"]
    assert decode[decode.index("--kv-cache-dtype") + 1] == "fp8_e5m2"
    assert router[router.index("--queue-size") + 1] == "7"
    assert router[router.index("--prometheus-host") + 1 : router.index("--prometheus-host") + 4] == [
        "127.0.0.1", "--prometheus-port", "29000"]  # fmt: skip
    # An empty switch leaves the variable to SGLang: the decode's environment does not carry it.
    assert "SGLANG_SM120_FLASHMLA_BACKEND" not in specs["decode"]["environment"]
