"""The serving topology model (pd_appliance.serving.topology): names, the published form, refusals."""

from __future__ import annotations

import pytest

from pd_appliance.serving.topology import (
    TopologyError,
    default_instances,
    instances,
    program_names,
    published,
)

LAB_PER_ROLE = {
    "serving_prefill_gpus": [0, 1, 2, 3], "serving_decode_gpus": [4, 5, 6, 7], "serving_prefill_tp_size": 4,
    "serving_decode_tp_size": 4, "serving_prefill_port": 30000, "serving_decode_port": 30001,
    "serving_bootstrap_port": 8998,
}  # fmt: skip
ONE_P_THREE_D = [
    {"role": "prefill", "gpus": [0, 1], "tp_size": 2, "port": 30000, "bootstrap_port": 8998},
    {"role": "decode", "gpus": [2, 3], "tp_size": 2, "port": 30001},
    {"role": "decode", "gpus": [4, 5], "port": "30002", "env": {"PD_X": "1"}, "extra_args": ["--foo", "1"]},
    {"role": "decode", "gpus": [6, 7], "tp_size": 2, "port": 30003},
]


def test_per_role_variables_build_the_lab_layout_by_group() -> None:
    assert default_instances(["prefill", "decode", "router"], LAB_PER_ROLE) == [
        {"role": "prefill", "gpus": [0, 1, 2, 3], "tp_size": 4, "port": 30000, "bootstrap_port": 8998},
        {"role": "decode", "gpus": [4, 5, 6, 7], "tp_size": 4, "port": 30001},
    ]
    assert [i["role"] for i in default_instances(["decode"], LAB_PER_ROLE)] == ["decode"]
    assert default_instances(["router"], LAB_PER_ROLE) == []


def test_program_names_stay_the_role_alone_and_are_numbered_when_it_repeats() -> None:
    lab = default_instances(["prefill", "decode"], LAB_PER_ROLE)
    assert program_names(lab) == ["prefill", "decode"]
    assert program_names(ONE_P_THREE_D) == ["prefill", "decode-0", "decode-1", "decode-2"]
    named = [ONE_P_THREE_D[0], dict(ONE_P_THREE_D[1], name="decode-fast"), ONE_P_THREE_D[2]]
    assert program_names(named) == ["prefill", "decode-fast", "decode-1"]


def test_published_form_is_what_every_stage_reads() -> None:
    found = instances(ONE_P_THREE_D, ["prefill", "decode", "router"], "gpu-node-01", "10.0.0.5")
    assert [i.as_dict() for i in found][2] == {
        "role": "decode", "name": "decode-1", "gpus": [4, 5], "tp_size": 2, "port": 30002,
        "bootstrap_port": None, "env": {"PD_X": "1"}, "extra_args": ["--foo", "1"],
        "url": "http://10.0.0.5:30002", "host": "gpu-node-01",
    }  # fmt: skip
    assert [(i.name, i.url, i.bootstrap_port) for i in found][:2] == [
        ("prefill", "http://10.0.0.5:30000", 8998), ("decode-0", "http://10.0.0.5:30001", None)]  # fmt: skip
    assert published(ONE_P_THREE_D, "h", "fd00::1")[0]["url"] == "http://[fd00::1]:30000"


def test_published_never_fails_it_only_leaves_out_what_cannot_be_an_instance() -> None:
    broken = [
        {"role": "decoder"},
        "junk",
        {"role": "decode", "gpus": "x", "port": "thirty"},
        ONE_P_THREE_D[0],
    ]
    assert [(i["name"], i["gpus"], i["port"]) for i in published(broken, "h", "127.0.0.1")] == [
        ("decode", [], "thirty"), ("prefill", [0, 1], 30000)]  # fmt: skip
    assert published(broken, roles=["decode"])[0]["name"] == "decode"
    assert published(None) == [] and published("not a list") == []


def test_instances_refuse_a_broken_layout_with_every_problem_at_once() -> None:
    layout = [dict(ONE_P_THREE_D[0], gpus=[0, 1, 2]), dict(ONE_P_THREE_D[1], port=30000)]
    with pytest.raises(TopologyError) as refused:
        instances(layout, ["prefill", "decode"], "gpu-node-01")
    message = str(refused.value)
    assert "gpu-node-01: serving_instances[0].tp_size=2 but serving_instances[0].gpus has 3 GPU(s)" in message
    assert "share GPU [2]" in message and "port 30000 is used by serving_instances[0].port and" in message


def test_router_ports_are_reserved_on_a_router_host() -> None:
    layout = [ONE_P_THREE_D[0], dict(ONE_P_THREE_D[1], port=8000)]
    with pytest.raises(
        TopologyError, match=r"port 8000 is used by serving_instances\[1\]\.port and serving_router_port"
    ):
        instances(layout, ["prefill", "decode", "router"], "h", reserved_ports={"serving_router_port": 8000})
