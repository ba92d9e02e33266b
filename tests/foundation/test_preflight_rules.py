"""Unit tests of pd_appliance.preflight: each rule passes good input and names the fix for bad."""

from __future__ import annotations

from pd_appliance import preflight

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
    assert preflight.topology_errors("h", ALL_ROLES, 8, LAB) == []


def test_overlapping_gpu_sets_name_both_variables():
    errors = preflight.topology_errors("h", ALL_ROLES, 8, with_(serving_decode_gpus=[3, 4, 5, 6]))
    assert len(errors) == 1
    assert "serving_prefill_gpus" in errors[0] and "serving_decode_gpus" in errors[0]
    assert "share GPU [3]" in errors[0]


def test_overlap_is_allowed_across_hosts():
    # A decode-only host may use the same indices as a prefill-only host.
    assert preflight.topology_errors("d", ["decode"], 8, with_(serving_decode_gpus=[0, 1, 2, 3])) == []


def test_gpu_index_beyond_host():
    errors = preflight.topology_errors("h", ALL_ROLES, 6, LAB)
    assert any("names GPU [6, 7]" in e and "has 6 GPU(s)" in e for e in errors)


def test_tp_size_must_match_gpu_count():
    errors = preflight.topology_errors("h", ALL_ROLES, 8, with_(serving_decode_gpus=[4, 5, 6]))
    assert errors == [
        "h: serving_decode_tp_size=4 but serving_decode_gpus has 3 GPU(s) [4, 5, 6]: TP size must equal the "
        "number of GPUs. Set serving_decode_tp_size: 3 or give serving_decode_gpus 4 GPUs."
    ]


def test_duplicate_gpu_in_one_set():
    errors = preflight.topology_errors("h", ["prefill"], 8, with_(serving_prefill_gpus=[0, 0, 1, 2]))
    assert any("lists GPU [0] more than once" in e for e in errors)


def test_colliding_ports_named():
    errors = preflight.topology_errors("h", ALL_ROLES, 8, with_(serving_router_port=30001))
    assert errors == [
        "h: port 30001 is used by serving_decode_port and serving_router_port; each server on a host needs "
        "its own port. Change one of them in the inventory."
    ]


def test_ports_only_count_roles_on_the_host():
    assert preflight.topology_errors("r", ["router"], None, with_(serving_router_port=30001)) == []


def test_invalid_port():
    errors = preflight.port_errors("h", ["router"], with_(serving_router_port=70000))
    assert errors == ["h: serving_router_port must be a TCP port (1-65535), got 70000."]


def test_missing_variables():
    errors = preflight.missing_variable_errors("h", ["a", "b", "c"], {"a": "x", "b": ""})
    assert "variable b is not set" in errors[0] and "variable c is not set" in errors[1]
    assert len(errors) == 2


def test_disk_uses_longest_mount_prefix():
    mounts = [
        {"mount": "/", "size_available": 10 * 2**30},
        {"mount": "/srv", "size_available": 200 * 2**30},
    ]
    assert preflight.mount_for("/srv/models/x", mounts)["mount"] == "/srv"
    assert preflight.disk_errors("h", "/srv/models/x", mounts, 160 * 10**9) == []
    errors = preflight.disk_errors("h", "/opt/models", mounts, 160 * 10**9)
    assert len(errors) == 1 and "/ has 10.0 GiB free" in errors[0] and "appliance_model_dir" in errors[0]


def test_disk_counts_what_is_already_there():
    mounts = [{"mount": "/", "size_available": 10 * 2**30}]
    assert preflight.disk_errors("h", "/m", mounts, 100 * 2**30, present_bytes=95 * 2**30) == []


def test_os_support():
    supported = {"Ubuntu": ["22.04", "24.04"], "Debian": ["12"]}
    assert preflight.os_errors("h", "Ubuntu", "24.04", supported) == []
    errors = preflight.os_errors("h", "Ubuntu", "20.04", supported)
    assert "Ubuntu 20.04 is not supported" in errors[0] and "Ubuntu 22.04/24.04" in errors[0]


def test_pci_gpu_count_only_nvidia_display_controllers():
    devices = [
        {"vendor": "0x10de", "class": "0x030000"},  # VGA
        {"vendor": "0x10de", "class": "0x030200"},  # 3D controller
        {"vendor": "0x10de", "class": "0x040300"},  # the GPU's HDMI audio function
        {"vendor": "0x8086", "class": "0x030000"},  # another vendor's VGA
    ]
    assert preflight.pci_gpu_count(devices) == 2


def test_documentation_addresses():
    assert preflight.is_documentation_address("192.0.2.10")
    assert not preflight.is_documentation_address("10.1.2.3")
    assert not preflight.is_documentation_address("gpu-node-01")
