"""GPU pinning, NUMA binding and the exact SGLang / smg command lines."""

from __future__ import annotations

import pytest

from pd_appliance.serving.commands import CommandError, router_argv, router_workers, sglang_argv, worker_url
from pd_appliance.serving.pinning import PinningError, gpu_binding, gpu_bindings, parse_node_list
from pd_standins.gpus import STAND_IN, simulated_gpu

# What NVML reports for the lab's GPUs: the stand-in's figures, no stand-in named.
LAB_FACTS = [dict(simulated_gpu(i), simulated=False, stand_in=None) for i in range(8)]


def test_lab_split_binds_each_role_to_its_numa_node() -> None:
    prefill = gpu_binding([0, 1, 2, 3], LAB_FACTS)
    decode = gpu_binding([4, 5, 6, 7], LAB_FACTS)
    assert prefill["cuda_visible_devices"] == "0,1,2,3"
    assert prefill["numactl_args"] == ["--cpunodebind=0", "--membind=0"]
    assert decode["numactl_args"] == ["--cpunodebind=1", "--membind=1"]
    assert not prefill["spans_numa_nodes"] and prefill["stand_in"] is None


def test_gpus_spanning_nodes_bind_to_both_and_say_so() -> None:
    binding = gpu_binding([2, 3, 4, 5], LAB_FACTS)
    assert binding["numactl_args"] == ["--cpunodebind=0,1", "--membind=0,1"] and binding["spans_numa_nodes"]


def test_unknown_numa_node_means_no_binding() -> None:
    facts = [dict(f, numa_node=-1) for f in LAB_FACTS]
    binding = gpu_binding([0, 1], facts)
    assert binding["numactl_args"] == [] and binding["gpus_without_numa_node"] == [0, 1]


def test_simulated_gpus_bind_to_the_nodes_the_machine_has() -> None:
    simulated = [simulated_gpu(i) for i in range(8)]
    # One-node machine (the CI runner, a molecule container): the lab's node 1 binds to node 0.
    decode = gpu_binding([4, 5, 6, 7], simulated, host_numa_online="0\n")
    assert decode["numactl_args"] == ["--cpunodebind=0", "--membind=0"]
    assert decode["numa_nodes"] == [1] and decode["bind_numa_nodes"] == [0] and decode["stand_in"] == STAND_IN
    # A two-node machine keeps the lab's nodes; a machine without NUMA gets no prefix.
    node_1 = ["--cpunodebind=1", "--membind=1"]
    assert gpu_binding([4, 5], simulated, host_numa_online="0-1")["numactl_args"] == node_1
    assert gpu_binding([4, 5], simulated, host_numa_online=None)["numactl_args"] == []
    # Real GPUs never use the machine's node list: their own node is the binding.
    assert gpu_binding([4, 5], LAB_FACTS, host_numa_online="0")["numactl_args"] == node_1
    assert parse_node_list("0,2-3") == [0, 2, 3]
    with pytest.raises(PinningError, match="not a kernel node list"):
        parse_node_list("zero")


def test_gpu_missing_from_facts_names_the_variable() -> None:
    with pytest.raises(PinningError, match=r"serving_decode_gpus names GPU\(s\) \[8\]"):
        gpu_binding([7, 8], LAB_FACTS, "serving_decode_gpus")


def test_a_hosts_instances_are_pinned_in_one_call_by_program_name() -> None:
    instances = [{"name": "prefill", "gpus": [0, 1, 2, 3]}, {"name": "decode-1", "gpus": [4, 5]}]
    simulated = [simulated_gpu(i) for i in range(8)]
    # The machine's node list binds a stand-in's GPUs; real GPUs keep their own node.
    assert gpu_bindings(instances, simulated, "0\n")["decode-1"]["numactl_args"] == [
        "--cpunodebind=0",
        "--membind=0",
    ]
    assert gpu_bindings(instances, LAB_FACTS, "0")["decode-1"]["numactl_args"] == [
        "--cpunodebind=1",
        "--membind=1",
    ]
    assert gpu_bindings(instances, simulated, "")["prefill"]["numactl_args"] == []
    assert list(gpu_bindings(instances, LAB_FACTS)) == ["prefill", "decode-1"]
    assert gpu_bindings([], None) == {}
    with pytest.raises(
        PinningError, match=r"the GPUs of pd:decode-1 \(serving_instances\) names GPU\(s\) \[8\]"
    ):
        gpu_bindings([{"name": "decode-1", "gpus": [7, 8]}], LAB_FACTS)


SETTINGS = {
    "model_path": "/srv/models/DeepSeek-V4-Flash-NVFP4", "served_model_name": "dsv4-flash",
    "trust_remote_code": True, "tp_size": 4, "host": "127.0.0.1", "port": 30000, "bootstrap_port": 8998,
    "transfer_backend": "nixl", "ib_device": "", "moe_runner_backend": "flashinfer_cutlass",
    "kv_cache_dtype": "fp8_e4m3", "mem_fraction_static": 0.88, "context_length": None,
    "enable_metrics": True, "cuda_graph": True, "cuda_graph_max_bs": None,
    "speculative": {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4},
    "extra_args": [["--watchdog-timeout", "600"]],
}  # fmt: skip


def test_prefill_command_is_references_pd_launch() -> None:
    argv = sglang_argv(["python", "-m", "sglang.launch_server"], "prefill", SETTINGS)
    assert argv == [
        "python", "-m", "sglang.launch_server", "--model-path", "/srv/models/DeepSeek-V4-Flash-NVFP4",
        "--served-model-name", "dsv4-flash", "--trust-remote-code", "--tp-size", "4", "--host", "127.0.0.1",
        "--port", "30000", "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "nixl",
        "--disaggregation-bootstrap-port", "8998", "--moe-runner-backend", "flashinfer_cutlass",
        "--kv-cache-dtype", "fp8_e4m3", "--mem-fraction-static", "0.88", "--enable-metrics",
        "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--watchdog-timeout", "600",
    ]  # fmt: skip
    assert "--quantization" not in argv and "--cuda-graph-max-bs" not in argv


def test_decode_command_has_no_bootstrap_port_and_its_graph_size() -> None:
    settings = dict(SETTINGS, port=30001, cuda_graph_max_bs=32, extra_args=[])
    argv = sglang_argv(["python"], "decode", settings)
    assert "--disaggregation-bootstrap-port" not in argv
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "32"
    no_graphs = sglang_argv(["python"], "decode", dict(settings, cuda_graph=False))
    assert "--disable-cuda-graph" in no_graphs and "--cuda-graph-max-bs-decode" not in no_graphs


@pytest.mark.parametrize(
    ("spec", "match"),
    [({"algorithm": "NEXTN"}, "accepts EAGLE"), ({"algorithm": "DSPARK"}, "PD"),
     ({"algorithm": "EAGLE", "eagle_topk": 2}, "topk")],
)  # fmt: skip
def test_speculative_settings_deepseek_v4_rejects(spec, match) -> None:
    with pytest.raises(CommandError, match=match):
        sglang_argv(["python"], "prefill", dict(SETTINGS, speculative=spec))


def test_router_reads_every_prefill_and_decode_instance_from_its_discovery_file() -> None:
    settings = {
        "prefill": [{"url": "http://10.0.0.1:30000", "bootstrap_port": 8998},
                    {"url": "http://10.0.0.1:30002", "bootstrap_port": 8999}],
        "decode": [{"url": f"http://10.0.0.2:{port}"} for port in (30001, 30003, 30005)],
        "host": "127.0.0.1", "port": 8000, "extra_args": [], "discovery_file": "/srv/pd/router-workers.json",
    }  # fmt: skip
    argv = router_argv(["smg", "launch"], settings)
    assert argv[:7] == [
        "smg", "launch", "--pd-disaggregation", "--discovery-provider", "file",
        "--discovery-file", "/srv/pd/router-workers.json",
    ]  # fmt: skip
    # No worker on the command line: a fleet change does not change it (the file does).
    assert not [w for w in argv if w.startswith("http://")]
    fewer = dict(settings, decode=settings["decode"][:1], prefill=settings["prefill"][:1])
    assert router_argv(["smg", "launch"], fewer) == argv
    assert router_workers(settings["prefill"], settings["decode"], []) == ("pd", [
        {"url": "http://10.0.0.1:30000", "worker_type": "prefill", "bootstrap_port": 8998},
        {"url": "http://10.0.0.1:30002", "worker_type": "prefill", "bootstrap_port": 8999},
        {"url": "http://10.0.0.2:30001", "worker_type": "decode"},
        {"url": "http://10.0.0.2:30003", "worker_type": "decode"},
        {"url": "http://10.0.0.2:30005", "worker_type": "decode"},
    ])  # fmt: skip


def test_router_workers_always_give_the_bootstrap_port() -> None:
    settings = {
        "prefill": [{"url": "http://10.0.0.1:30000", "bootstrap_port": 8998}],
        "decode": [{"url": "http://10.0.0.2:30001"}],
        "host": "127.0.0.1", "port": 8000, "policy": "round_robin", "prometheus_host": "127.0.0.1",
        "prometheus_port": 29000, "health_check_interval_secs": 10, "extra_args": [],
        "discovery_file": "/srv/pd/router-workers.json",
    }  # fmt: skip
    assert router_argv(["smg", "launch"], settings) == [
        "smg", "launch", "--pd-disaggregation", "--discovery-provider", "file",
        "--discovery-file", "/srv/pd/router-workers.json", "--host", "127.0.0.1", "--port", "8000",
        "--policy", "round_robin",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", "29000", "--health-check-interval-secs", "10",
    ]  # fmt: skip
    with pytest.raises(CommandError, match="no bootstrap port"):
        router_argv(["smg"], dict(settings, prefill=[{"url": "http://x:1", "bootstrap_port": None}]))
    with pytest.raises(CommandError, match="inventory groups"):
        router_argv(["smg"], dict(settings, decode=[]))
    with pytest.raises(CommandError, match="serving_router_discovery_file"):
        router_argv(["smg"], dict(settings, discovery_file=""))


def test_worker_url_brackets_ipv6() -> None:
    assert worker_url("fd00::1", 30000) == "http://[fd00::1]:30000"
    assert worker_url("192.0.2.10", "30001") == "http://192.0.2.10:30001"


def test_aggregated_command_has_no_disaggregation_flag_and_both_phases_graphs() -> None:
    settings = dict(SETTINGS, cuda_graph_max_bs={"prefill": 8, "decode": 32}, chunked_prefill_size=8192)
    argv = sglang_argv(["python", "-m", "sglang.launch_server"], "aggregated", settings)
    assert not [w for w in argv if w.startswith("--disaggregation")]
    assert argv[argv.index("--cuda-graph-max-bs-prefill") + 1] == "8"
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "32"
    assert argv[argv.index("--chunked-prefill-size") + 1] == "8192"
    assert argv[argv.index("--tp-size") + 1] == "4" and "--speculative-algorithm" in argv
    # A phase left to SGLang's default is not spelt; graphs off is the one flag, as for PD engines.
    default_prefill = sglang_argv(["python"], "aggregated", dict(settings, cuda_graph_max_bs={"decode": 32}))
    assert "--cuda-graph-max-bs-prefill" not in default_prefill
    off = sglang_argv(["python"], "aggregated", dict(settings, cuda_graph=False))
    assert "--disable-cuda-graph" in off and not [w for w in off if w.startswith("--cuda-graph-max-bs")]
    with pytest.raises(CommandError, match="prefill, decode or aggregated"):
        sglang_argv(["python"], "unified", settings)


AGGREGATED_ROUTER = {
    "aggregated": [{"url": "http://10.0.0.1:30000"}, {"url": "http://10.0.0.1:30001"}],
    "host": "127.0.0.1", "port": 8000, "policy": "round_robin", "aggregated_policy": "cache_aware",
    "pd_admission_wait_secs": 30, "extra_args": [], "discovery_file": "/srv/pd/router-workers.json",
}  # fmt: skip


def test_router_over_aggregated_instances_is_smgs_regular_mode_with_its_own_policy() -> None:
    assert router_argv(["smg", "launch"], AGGREGATED_ROUTER) == [
        "smg", "launch", "--discovery-provider", "file", "--discovery-file", "/srv/pd/router-workers.json",
        "--host", "127.0.0.1", "--port", "8000", "--policy", "cache_aware",
    ]  # fmt: skip
    assert router_workers([], [], AGGREGATED_ROUTER["aggregated"]) == ("aggregated", [
        {"url": "http://10.0.0.1:30000", "worker_type": "regular"},
        {"url": "http://10.0.0.1:30001", "worker_type": "regular"},
    ])  # fmt: skip
    mixed = dict(AGGREGATED_ROUTER, decode=[{"url": "http://10.0.0.2:30001"}])
    with pytest.raises(CommandError, match="one mode: serving_instances mixes aggregated instances"):
        router_argv(["smg"], mixed)
