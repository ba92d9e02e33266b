"""The rendered layouts SGLang's parser and its model resolution read: the shipped lab, its two-host
variant and one host per tuning candidate, each rendered once per session by the serving role
(--tags serving_render) and shared, read-only, by test_server_args and test_model_resolution
(tests/sglang/conftest.py registers the fixtures; the two files run on one pytest worker)."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from sglang_testlib import SERIES_DIR, SGLANG_VERSION

from pd_appliance.sglang_args import rendered
from pd_appliance.sglang_args.parser_venv import ParserVenvInputs, ensure_parser_venv
from pd_appliance.sglang_args.real import RealSGLang
from pd_standins.gpus import simulated_gpu
from pd_testlib import ROOT, run_playbook, two_host_layout

LAB_GPUS = [
    dict(simulated_gpu(i), name="NVIDIA RTX PRO 6000 Blackwell", simulated=False, stand_in=None)
    for i in range(8)
]
CONF_D = "etc/pd-appliance/supervisor/conf.d"


@pytest.fixture(scope="session")
def real(sglang_wheel: Path) -> RealSGLang:
    inputs = ParserVenvInputs(
        wheel=sglang_wheel,
        requirements=ROOT / f"files/sglang/{SGLANG_VERSION}/parser-requirements.txt",
        series_dir=SERIES_DIR,
        sglang_version=SGLANG_VERSION,
    )
    return RealSGLang(ensure_parser_venv(inputs, ROOT / "artifacts" / "sglang-parser"))


def render_vars(root: Path | None, **extra: object) -> dict:
    owner = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    out = {
        "ansible_connection": "local", "ansible_become": False, "ansible_python_interpreter": sys.executable,
        "pd_gpus": LAB_GPUS, "serving_render_only": True, "serving_supervisor_manager": "direct",
        "serving_config_owner": owner, "serving_config_group": group, "serving_secrets_owner": owner,
        "serving_supervisor_socket_owner": owner, "serving_router_api_key": "router-key",
        "serving_worker_require_api_key": True, **extra,
    }  # fmt: skip
    if root is not None:
        out["appliance_root"] = str(root)
    return out


def render_layout(inventory: Path, variables: dict, tmp: Path) -> None:
    extra = tmp / "vars.json"
    extra.write_text(json.dumps(variables))
    result = run_playbook(
        "playbooks/serve.yml", inventory, "--tags", "serving_render", "-e", f"@{extra}", timeout=600
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def rendered_workers(*roots: Path) -> dict[str, rendered.EngineCommand]:
    found = {}
    for root in roots:
        for conf in sorted((root / CONF_D).glob("*.conf")):
            for command in rendered.engine_commands(conf):
                found[f"{root.name}/{command.program}"] = command
    return found


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """inventory/lab as shipped, with every switch the serving role turns into a flag or hook set."""
    root = tmp_path_factory.mktemp("lab") / "root"
    switches = {
        "serving_sglang_sm120_flashmla_backend": "triton", "serving_sglang_tilelang_indexer": True,
        "serving_sglang_paged_mqa_logits_torch": True, "serving_context_length": "128k",
        "serving_max_running_requests": 64, "serving_chunked_prefill_size": 8192,
        "serving_prefill_cuda_graph_max_bs": 8,
    }  # fmt: skip
    # serving_advertise_host: the host's address (a declared stand-in), as the lab host's would be.
    variables = render_vars(root, serving_advertise_host="192.0.2.10", **switches)
    render_layout(ROOT / "inventory/lab", variables, tmp_path_factory.mktemp("labvars"))
    return root


@pytest.fixture(scope="session")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab's two-host variant: prefill (and router) on one host, decode on another, KV by
    network; CUDA graphs off and an IB device, so the other flag branches are rendered too."""
    base = tmp_path_factory.mktemp("twohost")
    inventory = base / "inventory"
    shutil.copytree(ROOT / "inventory/lab/group_vars", inventory / "group_vars")
    # TP4 on GPUs 0-3 of each host.
    hosts = two_host_layout(
        {"appliance_root": str(base / "prefill"), "serving_prefill_gpus": [0, 1, 2, 3]},
        {"appliance_root": str(base / "decode"), "serving_decode_gpus": [0, 1, 2, 3]},
        serving_cuda_graph=False,
    )
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    render_layout(inventory / "hosts.yml", render_vars(None), base)
    return base


def lab_variants() -> list[dict]:
    """The tuning candidates the lab ships."""
    return yaml.safe_load((ROOT / "inventory/lab/group_vars/all/validation.yml").read_text())[
        "validation_variants"
    ]


@pytest.fixture(scope="session")
def variant_hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab layout once per candidate: each host renders the lab with its serving_variant, as the
    validation stage's tuner applies it through the serving role (one play, one host per candidate)."""
    base = tmp_path_factory.mktemp("variants")
    inventory = base / "inventory"
    shutil.copytree(ROOT / "inventory/lab/group_vars", inventory / "group_vars")
    hosts = {
        v["name"]: {"ansible_host": "192.0.2.10", "serving_advertise_host": "192.0.2.10",
                    "appliance_root": str(base / v["name"]), "serving_variant": v}
        for v in lab_variants()
    }  # fmt: skip
    # No router group: a router routes over every host's instances, and the candidates mix PD layouts
    # with aggregated ones (one router mode per deployment). Only the worker commands are parsed.
    groups = {role: {"hosts": dict.fromkeys(hosts)} for role in ("prefill", "decode")}
    (inventory / "hosts.yml").write_text(
        yaml.safe_dump({"pd_appliance": {"children": groups, "hosts": hosts}})
    )
    render_layout(inventory / "hosts.yml", render_vars(None), base)
    return base
