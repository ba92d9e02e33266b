"""The serving topology model (pd_appliance.serving.topology): names, the published form, refusals."""

from __future__ import annotations

import pytest

from pd_appliance.serving.topology import (
    TopologyError,
    default_instances,
    instances,
    mode,
    mode_problems,
    problems,
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


AGGREGATED_2X_TP4 = [
    {"role": "aggregated", "gpus": [0, 1, 2, 3], "tp_size": 4, "port": 30000},
    {"role": "aggregated", "gpus": [4, 5, 6, 7], "tp_size": 4, "port": 30001},
]


def test_aggregated_instances_run_on_a_worker_host_without_bootstrap_ports() -> None:
    found = instances(AGGREGATED_2X_TP4, ["prefill", "decode", "router"], "gpu-node-01", "10.0.0.5")
    assert [(i.role, i.name, i.url, i.bootstrap_port) for i in found] == [
        ("aggregated", "aggregated-0", "http://10.0.0.5:30000", None),
        ("aggregated", "aggregated-1", "http://10.0.0.5:30001", None),
    ]
    # A host of either worker group may run them (no prefill instance is missing then).
    assert [i.name for i in instances(AGGREGATED_2X_TP4, ["decode"], "h")] == ["aggregated-0", "aggregated-1"]
    assert mode(published(AGGREGATED_2X_TP4, "h")) == "aggregated"
    assert mode(published(ONE_P_THREE_D, "h")) == "pd" and mode([]) is None
    named = [dict(AGGREGATED_2X_TP4[0], name="aggregated-big"), AGGREGATED_2X_TP4[1]]
    assert program_names(named) == ["aggregated-big", "aggregated-1"]


def test_aggregated_entries_are_refused_where_they_cannot_serve() -> None:
    # Not a worker host: the router finds workers by the prefill/decode groups.
    assert any(
        "neither inventory group prefill nor decode" in p
        for p in problems("r", AGGREGATED_2X_TP4, ["router"])
    )
    # A bootstrap port is a prefill's alone; a PD name is not an aggregated program's.
    bad = [dict(AGGREGATED_2X_TP4[0], bootstrap_port=8998, name="decode-x")]
    messages = " ".join(problems("h", bad, ["prefill", "decode"]))
    assert "is an aggregated instance with bootstrap_port 8998; only prefill instances open one" in messages
    assert "name='decode-x' is not a program name for an instance of role aggregated" in messages


def test_a_host_mixing_aggregated_and_pd_instances_is_refused_naming_the_fix() -> None:
    mixed = [ONE_P_THREE_D[0], dict(AGGREGATED_2X_TP4[1], port=30005)]
    with pytest.raises(TopologyError) as refused:
        instances(mixed, ["prefill", "decode"], "gpu-node-01")
    message = str(refused.value)
    assert (
        "gpu-node-01: serving_instances mixes aggregated instances (pd:aggregated) with prefill/decode "
        "instances (pd:prefill)" in message
    )
    fix = "Set role: aggregated on every entry of every worker host's serving_instances, or on none"
    assert fix in message
    # Without the mix, the same host in both groups is fine either way.
    assert problems("gpu-node-01", AGGREGATED_2X_TP4, ["prefill", "decode"]) == []


def test_a_deployment_has_one_router_mode_across_hosts() -> None:
    layouts = {"gpu-a": AGGREGATED_2X_TP4, "gpu-b": ONE_P_THREE_D, "gpu-c": None}
    (message,) = mode_problems(layouts)
    assert "(gpu-a:pd:aggregated-0, gpu-a:pd:aggregated-1)" in message
    assert "gpu-b:pd:prefill" in message and "gpu-b:pd:decode-2" in message
    assert mode_problems({"gpu-a": AGGREGATED_2X_TP4, "gpu-b": AGGREGATED_2X_TP4}) == []
    with pytest.raises(TopologyError, match="mixes aggregated"):
        mode(published(AGGREGATED_2X_TP4, "a") + published(ONE_P_THREE_D, "b"))
