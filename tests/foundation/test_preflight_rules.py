"""Unit tests of pd_appliance.host_checks: each rule passes good input and names the fix for bad."""

from __future__ import annotations

from pd_appliance import host_checks

LAB = {
    "serving_prefill_gpus": [0, 1, 2, 3],
    "serving_decode_gpus": [4, 5, 6, 7],
    "serving_prefill_tp_size": 4,
    "serving_decode_tp_size": 4,
    "serving_prefill_port": 30000,
    "serving_decode_port": 30001,
    "serving_bootstrap_port": 8998,
    "serving_router_port": 8000,
    "serving_router_metrics_port": 29000,
}
ALL_ROLES = ["prefill", "decode", "router"]


def with_(**changes):
    return {**LAB, **changes}


def test_lab_topology_is_clean():
    assert host_checks.topology_errors("h", ALL_ROLES, 8, LAB) == []


def test_overlapping_gpu_sets_name_both_variables():
    errors = host_checks.topology_errors("h", ALL_ROLES, 8, with_(serving_decode_gpus=[3, 4, 5, 6]))
    assert len(errors) == 1
    assert "serving_prefill_gpus" in errors[0] and "serving_decode_gpus" in errors[0]
    assert "share GPU [3]" in errors[0]


def test_overlap_is_allowed_across_hosts():
    # A decode-only host may use the same indices as a prefill-only host.
    assert host_checks.topology_errors("d", ["decode"], 8, with_(serving_decode_gpus=[0, 1, 2, 3])) == []


def test_gpu_index_beyond_host():
    errors = host_checks.topology_errors("h", ALL_ROLES, 6, LAB)
    assert any("names GPU [6, 7]" in e and "has 6 GPU(s)" in e for e in errors)


def test_tp_size_must_match_gpu_count():
    errors = host_checks.topology_errors("h", ALL_ROLES, 8, with_(serving_decode_gpus=[4, 5, 6]))
    assert errors == [
        "h: serving_decode_tp_size=4 but serving_decode_gpus has 3 GPU(s) [4, 5, 6]: TP size must equal the "
        "number of GPUs. Set serving_decode_tp_size: 3 or give serving_decode_gpus 4 GPUs."
    ]


def test_duplicate_gpu_in_one_set():
    errors = host_checks.topology_errors("h", ["prefill"], 8, with_(serving_prefill_gpus=[0, 0, 1, 2]))
    assert any("lists GPU [0] more than once" in e for e in errors)


def test_colliding_ports_named():
    errors = host_checks.topology_errors("h", ALL_ROLES, 8, with_(serving_router_port=30001))
    assert errors == [
        "h: port 30001 is used by serving_decode_port and serving_router_port; each server on a host needs "
        "its own port. Change one of them in the inventory."
    ]


def test_ports_only_count_roles_on_the_host():
    assert host_checks.topology_errors("r", ["router"], None, with_(serving_router_port=30001)) == []


def test_invalid_port():
    errors = host_checks.topology_errors("h", ["router"], 8, with_(serving_router_port=70000))
    assert errors == ["h: serving_router_port must be a TCP port (1-65535), got 70000."]


# ---- serving_instances: any number of prefill and decode instances per host -----------------------
def _inst(role, gpus, port, bootstrap=None, **more):
    entry = {"role": role, "gpus": gpus, "tp_size": len(gpus), "port": port, **more}
    if bootstrap is not None:
        entry["bootstrap_port"] = bootstrap
    return entry


P1_D3 = [_inst("prefill", [0, 1], 30000, 8998), _inst("decode", [2, 3], 30001),
         _inst("decode", [4, 5], 30002), _inst("decode", [6, 7], 30003)]  # fmt: skip
P2_D2 = [_inst("prefill", [0, 1], 30000, 8998), _inst("prefill", [2, 3], 30002, 8999),
         _inst("decode", [4, 5], 30001), _inst("decode", [6, 7], 30003)]  # fmt: skip


def test_the_issues_layouts_on_one_8_gpu_host_are_clean():
    assert host_checks.topology_errors("h", ALL_ROLES, 8, LAB) == []
    assert host_checks.topology_errors("h", ALL_ROLES, 8, with_(serving_instances=P1_D3)) == []
    assert host_checks.topology_errors("h", ALL_ROLES, 8, with_(serving_instances=P2_D2)) == []


def test_instances_sharing_a_gpu_are_named_by_entry():
    layout = [*P1_D3[:3], _inst("decode", [5, 6], 30003)]
    assert host_checks.topology_errors("h", ALL_ROLES, 8, with_(serving_instances=layout)) == [
        "h: serving_instances[2].gpus=[4, 5] and serving_instances[3].gpus=[5, 6] share GPU [5]; instances "
        "on one host need disjoint GPU sets (the lab default is [0, 1, 2, 3] and [4, 5, 6, 7])."
    ]


def test_instance_gpu_beyond_the_host_and_tp_mismatch():
    layout = [P1_D3[0], _inst("decode", [2, 3], 30001, tp_size=4), _inst("decode", [8, 9], 30002)]
    errors = host_checks.topology_errors("h", ALL_ROLES, 8, with_(serving_instances=layout))
    assert errors == [
        "h: serving_instances[1].tp_size=4 but serving_instances[1].gpus has 2 GPU(s) [2, 3]: TP size must "
        "equal the number of GPUs. Set serving_instances[1].tp_size: 2 or give serving_instances[1].gpus 4 "
        "GPUs.",
        "h: serving_instances[2].gpus=[8, 9] names GPU [8, 9], but the host has 8 GPU(s) (indices 0-7). Fix "
        "serving_instances[2].gpus in the inventory.",
    ]


def test_ports_collide_across_instances_bootstrap_and_router():
    layout = [
        _inst("prefill", [0, 1], 30000, 30002),
        _inst("decode", [2, 3], 30002),
        _inst("decode", [4, 5], 8000),
    ]
    errors = host_checks.topology_errors("h", ALL_ROLES, 8, with_(serving_instances=layout))
    assert errors == [
        "h: port 8000 is used by serving_instances[2].port and serving_router_port; each server on a host "
        "needs its own port. Change one of them in the inventory.",
        "h: port 30002 is used by serving_instances[0].bootstrap_port and serving_instances[1].port; each "
        "server on a host needs its own port. Change one of them in the inventory.",
    ]


def test_bootstrap_port_belongs_to_prefill_instances_only():
    layout = [_inst("prefill", [0, 1], 30000), _inst("decode", [2, 3], 30001, 8999)]
    errors = host_checks.topology_errors("h", ["prefill", "decode"], 8, with_(serving_instances=layout))
    assert errors == [
        "h: serving_instances[0].bootstrap_port must be a TCP port (1-65535), got None: every prefill "
        "instance needs its own disaggregation bootstrap port (decode dials it for the KV).",
        "h: serving_instances[1] (decode) is a decode instance with bootstrap_port 8999; only prefill "
        "instances open one. Remove it.",
    ]


def test_roles_must_match_the_hosts_groups():
    errors = host_checks.topology_errors("d", ["decode"], 8, with_(serving_instances=[P1_D3[0]]))
    assert errors == [
        "d: serving_instances[0] (prefill) is a prefill instance but the host is not in inventory group "
        "prefill (the router finds prefill instances by that group): add the host to group prefill or "
        "remove the instance.",
        "d: the host is in inventory group decode but serving_instances has no decode instance: add one "
        "(role: decode), make every entry role: aggregated, or take the host out of group decode.",
    ]


def test_program_names_are_unique_readable_and_keys_known():
    layout = [P1_D3[0], _inst("decode", [2, 3], 30001, name="decode-1"), _inst("decode", [4, 5], 30002),
              _inst("decode", [6, 7], 30003, name="fast decode", tp=2)]  # fmt: skip
    errors = host_checks.topology_errors("h", ALL_ROLES, 8, with_(serving_instances=layout))
    assert errors == [
        "h: serving_instances[3] (fast decode) has unknown key(s) ['tp']; an instance takes role, name, "
        "gpus, tp_size, port, bootstrap_port, env, extra_args.",
        "h: serving_instances[3].name='fast decode' is not a program name for an instance of role decode: "
        "use decode or decode-<letters, digits, _> (it becomes pd:<name>).",
        "h: serving_instances entries [1, 2] would all be the program pd:decode-1: give each its own name "
        "(or leave name out: several instances of a role are numbered decode-0, -1, ...).",
    ]


def test_host_ports_name_every_instance_port():
    assert host_checks.host_ports(ALL_ROLES, LAB) == {
        "serving_prefill_port": 30000, "serving_bootstrap_port": 8998, "serving_decode_port": 30001,
        "serving_router_port": 8000, "serving_router_metrics_port": 29000,
    }  # fmt: skip
    ports = host_checks.host_ports(["prefill", "decode"], with_(serving_instances=P2_D2))
    assert ports == {
        "serving_instances[0].port of pd:prefill-0": 30000,
        "serving_instances[0].bootstrap_port of pd:prefill-0": 8998,
        "serving_instances[1].port of pd:prefill-1": 30002,
        "serving_instances[1].bootstrap_port of pd:prefill-1": 8999,
        "serving_instances[2].port of pd:decode-0": 30001,
        "serving_instances[3].port of pd:decode-1": 30003,
    }


# ---- each instance's TP share of the weights must fit its GPUs -----------------------------------
CHECKPOINT = 149_000_000_000  # checkpoint_size_bytes of the lab (DeepSeek-V4-Flash NVFP4)
RTX_PRO_6000_MIB = 97887


def _memory(variables, gpu_memory=RTX_PRO_6000_MIB, source="preflight_gpu_memory_mib"):
    values = {"serving_mem_fraction_static": 0.88, **variables}
    return host_checks.memory_errors(
        "h", ALL_ROLES, values, CHECKPOINT, "checkpoint_size_bytes", gpu_memory, source
    )


def test_lab_tp4_and_tp2_layouts_fit_the_lab_gpu():
    assert _memory(LAB) == []
    assert _memory(with_(serving_instances=P1_D3)) == []
    assert _memory(with_(serving_instances=P2_D2)) == []


def test_tp1_share_is_refused_naming_the_numbers_and_the_fix():
    layout = [P1_D3[0], _inst("decode", [2], 30001)]
    assert _memory(with_(serving_instances=layout)) == [
        "h: pd:decode (decode, tp_size 1 on GPU(s) [2]) needs 149000000000 bytes (138.8 GiB) of weights "
        "per GPU (checkpoint 149000000000 bytes from checkpoint_size_bytes / tp_size 1), but a GPU offers "
        "90324923842 bytes (84.1 GiB): 0.88 (serving_mem_fraction_static) of its 97887 MiB "
        "(preflight_gpu_memory_mib). In serving_instances give it at least 2 GPUs (tp_size 2); a higher "
        "serving_mem_fraction_static helps only while the KV cache keeps room beside the weights."
    ]


def test_nvml_facts_and_extra_args_fractions_count():
    # NVML facts: a 48 GB GPU among the decode GPUs makes TP2 too small (74.5 GB share > 0.88 x 48 GB).
    facts = [{"index": i, "memory_total_mib": 49152 if i == 5 else RTX_PRO_6000_MIB} for i in range(8)]
    errors = _memory(with_(serving_instances=P1_D3), facts, "NVML facts, pd_gpus")
    assert len(errors) == 1 and errors[0].startswith("h: pd:decode-1 (decode, tp_size 2 on GPU(s) [4, 5])")
    assert "of its 49152 MiB (NVML facts, pd_gpus). In serving_instances give it at least 4 GPUs" in errors[0]
    # A role's --mem-fraction-static wins over serving_mem_fraction_static: 0.7 x 97887 MiB < 74.5 GB.
    low = _memory(with_(serving_instances=P1_D3, serving_decode_extra_args=["--mem-fraction-static", "0.7"]))
    assert len(low) == 3 and all("0.7 (--mem-fraction-static in its extra args)" in e for e in low)
    high = _memory(with_(serving_instances=P1_D3, serving_decode_extra_args=["--mem-fraction-static=0.7"]))
    assert high == low


def test_missing_variables():
    errors = host_checks.missing_variable_errors("h", ["a", "b", "c"], {"a": "x", "b": ""})
    assert "variable b is not set" in errors[0] and "variable c is not set" in errors[1]
    assert len(errors) == 2


def test_disk_uses_longest_mount_prefix():
    mounts = [
        {"mount": "/", "size_available": 10 * 2**30},
        {"mount": "/srv", "size_available": 200 * 2**30},
    ]
    assert host_checks.mount_for("/srv/models/x", mounts)["mount"] == "/srv"
    assert host_checks.disk_errors("h", "/srv/models/x", mounts, 160 * 10**9) == []
    errors = host_checks.disk_errors("h", "/opt/models", mounts, 160 * 10**9)
    assert len(errors) == 1 and "/ has 10.0 GiB free" in errors[0] and "appliance_model_dir" in errors[0]


def test_disk_counts_what_is_already_there():
    mounts = [{"mount": "/", "size_available": 10 * 2**30}]
    assert host_checks.disk_errors("h", "/m", mounts, 100 * 2**30, present_bytes=95 * 2**30) == []


def test_os_support():
    supported = {"Ubuntu": ["22.04", "24.04"], "Debian": ["12"]}
    assert host_checks.os_errors("h", "Ubuntu", "24.04", supported) == []
    errors = host_checks.os_errors("h", "Ubuntu", "20.04", supported)
    assert "Ubuntu 20.04 is not supported" in errors[0] and "Ubuntu 22.04/24.04" in errors[0]


def test_pci_gpu_count_only_nvidia_display_controllers():
    devices = [
        {"vendor": "0x10de", "class": "0x030000"},  # VGA
        {"vendor": "0x10de", "class": "0x030200"},  # 3D controller
        {"vendor": "0x10de", "class": "0x040300"},  # the GPU's HDMI audio function
        {"vendor": "0x8086", "class": "0x030000"},  # another vendor's VGA
    ]
    assert host_checks.pci_gpu_count(devices) == 2


def test_documentation_addresses():
    assert host_checks.is_documentation_address("192.0.2.10")
    assert not host_checks.is_documentation_address("10.1.2.3")
    assert not host_checks.is_documentation_address("gpu-node-01")


AGGREGATED = [_inst("aggregated", [0, 1, 2, 3], 30000), _inst("aggregated", [4, 5, 6, 7], 30001)]


def test_aggregated_hosts_pass_and_a_deployment_with_one_router_mode_passes() -> None:
    assert host_checks.topology_errors("h", ALL_ROLES, 8, with_(serving_instances=AGGREGATED)) == []
    assert host_checks.router_mode_errors({"a": AGGREGATED, "b": AGGREGATED}) == []
    assert host_checks.router_mode_errors({"a": None, "b": P1_D3}) == []


def test_a_deployment_mixing_aggregated_and_pd_hosts_is_refused_naming_the_variable_and_fix() -> None:
    (message,) = host_checks.router_mode_errors({"gpu-a": AGGREGATED, "gpu-b": None})
    assert message.startswith("serving_instances mixes aggregated instances (gpu-a:pd:aggregated-0, ")
    assert "gpu-b:pd:prefill/decode (serving_instances unset: the per-role layout)" in message
    assert (
        "Set role: aggregated on every entry of every worker host's serving_instances, or on none." in message
    )
    # A host that mixes them itself is refused once, by its own topology check.
    mixed = [P1_D3[0], dict(AGGREGATED[1], port=30009)]
    assert host_checks.router_mode_errors({"gpu-a": mixed, "gpu-b": None}) == []
    assert any(
        "mixes aggregated" in e
        for e in host_checks.topology_errors("gpu-a", ALL_ROLES, 8, with_(serving_instances=mixed))
    )
