"""Render the serving role for the lab inventory (and a two-host variant) and read it back.

ansible-playbook runs playbooks/serve.yml with --tags serving_render on this machine (connection
local, paths under a temporary appliance_root, the lab's 8 GPUs given as NVML-shaped facts), so
nothing is started. The rendered files are parsed with supervisor's own parsers and asserted on:
exact argv, GPU sets, NUMA binding, environment, and that secrets stay out of them.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shlex
import stat
from pathlib import Path

import pytest
import yaml
from supervisor.datatypes import dict_of_key_value_pairs
from supervisor.options import UnhosedConfigParser

from pd_appliance.serving.runtime_env import CACHE_VARIABLES, CONTRACT_VARIABLES, PER_BUILD_VARIABLES
from pd_standins.gpus import simulated_gpu
from pd_testlib import run_playbook, two_host_layout

pytestmark = pytest.mark.slow

HF_TOKEN = "hf_lab_SECRET_token"
API_KEY = "router-SECRET-key"
LAB_GPUS = [
    dict(simulated_gpu(i), name="NVIDIA RTX PRO 6000 Blackwell", simulated=False, stand_in=None)
    for i in range(8)
]


def _owner_vars(root: Path) -> dict:
    user = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    return {
        "ansible_connection": "local", "ansible_become": False,
        "ansible_python_interpreter": os.sys.executable,
        "appliance_root": str(root), "pd_gpus": LAB_GPUS,
        "serving_config_owner": user, "serving_config_group": group, "serving_secrets_owner": user,
        "serving_supervisor_socket_owner": user,
        "serving_supervisor_manager": "systemd",
        "serving_supervisor_unit_path": str(root / "etc/systemd/system/pd-appliance-supervisor.service"),
        "checkpoint_hf_token": HF_TOKEN, "serving_router_api_key": API_KEY, "serving_render_only": True,
        # The host's address (a declared stand-in): the lab host's, as its primary IPv4 would give it.
        "serving_advertise_host": "192.0.2.10",
    }  # fmt: skip


def _program(conf: Path, name: str) -> dict:
    parser = UnhosedConfigParser()
    parser.read_string(conf.read_text())
    section = f"program:{name}"
    get = lambda key: parser.get(section, key) % {}  # noqa: E731 - supervisor's %-expansion
    return {
        "argv": shlex.split(get("command")),
        "env": dict_of_key_value_pairs(get("environment")),
        **{k: get(k) for k in ("user", "priority", "stopwaitsecs", "stopasgroup", "killasgroup",
                               "autorestart", "startsecs", "stdout_logfile", "stdout_logfile_maxbytes")},
        "text": conf.read_text(),
    }  # fmt: skip


def _numactl(argv: list[str]) -> list[str]:
    """The four words after the launcher's own `--`: the numactl prefix, when there is one."""
    start = argv.index("--") + 1
    return argv[start : start + 4]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo_root) -> Path:
    root = tmp_path_factory.mktemp("lab") / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    extra = tmp_path_factory.mktemp("vars") / "vars.json"
    extra.write_text(json.dumps(_owner_vars(root)))
    result = run_playbook("playbooks/serve.yml", repo_root / "inventory/lab", "--tags", "serving_render",
                          "-e", f"@{extra}", timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return root


def test_lab_prefill_command_gpus_and_numa(lab: Path) -> None:
    p = _program(lab / "etc/pd-appliance/supervisor/conf.d/prefill.conf", "prefill")
    tools, sglang = f"{lab}/opt/pd-appliance/tools/bin/python", p["argv"][10]
    # The release's venv: one per SGLang version and build (patch series + locks digest).
    assert re.fullmatch(rf"{lab}/opt/pd-appliance/sglang/0\.5\.23-[0-9a-f]{{12}}/bin/python", sglang), sglang
    assert p["argv"] == [
        tools, "-m", "pd_appliance.serving.launch",
        f"--env-file={lab}/etc/pd-appliance/serving/prefill.env",
        "--secret-arg=--api-key=SERVING_ROUTER_API_KEY", "--",
        "/usr/bin/numactl", "--cpunodebind=0", "--membind=0", "--",
        sglang, "-m", "sglang.launch_server",
        # Render only: checkpoint_revision (main) is not resolved to a commit here, so it names the directory.
        "--model-path", f"{lab}/srv/models/DeepSeek-V4-Flash-NVFP4/main",
        "--served-model-name", "dsv4-flash", "--trust-remote-code", "--tp-size", "4", "--host", "192.0.2.10",
        "--port", "30000", "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "nixl",
        "--disaggregation-bootstrap-port", "8998", "--moe-runner-backend", "flashinfer_cutlass",
        # No --speculative-*: MTP is off as shipped (roles/serving/defaults/main.yml says why).
        "--kv-cache-dtype", "fp8_e4m3", "--mem-fraction-static", "0.88", "--enable-metrics",
        "--log-level", "info",
    ]  # fmt: skip
    assert p["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert p["env"]["UCX_TLS"] == "cuda_ipc,cuda_copy,sm,self,tcp"
    assert p["env"]["SGLANG_DISAGGREGATION_NIXL_BACKEND"] == "UCX"
    deadlines = {
        k: v for k, v in p["env"].items() if k.startswith("SGLANG_DISAGGREGATION_") and "NIXL" not in k
    }
    assert deadlines == {
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "120", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "120",
        "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2", "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "3",
    }, "README Faults: the PD deadlines 120/120/2/3"  # fmt: skip
    assert "SGLANG_SM120_FLASHMLA_BACKEND" not in p["env"]
    assert p["user"] == "pd-appliance" and p["priority"] == "100"
    assert (p["stopasgroup"], p["killasgroup"], p["autorestart"]) == ("true", "true", "true")
    assert int(p["stopwaitsecs"]) >= 60 and p["stdout_logfile"] == f"{lab}/var/log/pd-appliance/prefill.log"
    assert "NUMA node(s) 0: /usr/bin/numactl --cpunodebind=0 --membind=0" in p["text"]
    assert "\n    --tp-size 4" in p["text"], "the command line is rendered one flag per line"
    assert f"directory={lab}/var/lib/pd-appliance/serving" in p["text"]


def test_lab_decode_is_pinned_to_the_other_node(lab: Path) -> None:
    d = _program(lab / "etc/pd-appliance/supervisor/conf.d/decode.conf", "decode")
    assert d["env"]["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert _numactl(d["argv"]) == ["/usr/bin/numactl", "--cpunodebind=1", "--membind=1", "--"]
    argv = d["argv"]
    assert argv[argv.index("--disaggregation-mode") + 1] == "decode"
    assert argv[argv.index("--port") + 1] == "30001"
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "32"
    assert "--disaggregation-bootstrap-port" not in argv


# The runtime contract (roles/serving/README.md, "The worker's runtime environment"): every worker's
# caches inside the program user's home, the toolkit's nvcc first, NVML (PCI) device order.
def test_every_worker_carries_the_runtime_contract_inside_the_program_users_home(lab: Path) -> None:
    home, cache = f"{lab}/var/lib/pd-appliance/home", f"{lab}/var/lib/pd-appliance/home/cache"
    for name in ("prefill", "decode"):
        p = _program(lab / f"etc/pd-appliance/supervisor/conf.d/{name}.conf", name)
        env, sglang_venv = p["env"], Path(p["argv"][p["argv"].index("-m", 3) - 1]).parent.parent
        assert [v for v in CONTRACT_VARIABLES if not env.get(v)] == [], name
        outside = {v: env[v] for v in CACHE_VARIABLES if not (env[v] + "/").startswith(home + "/")}
        assert outside == {}, f"pd:{name} caches outside {home}"
        build = f"{cache}/sglang/{sglang_venv.name}"
        assert re.fullmatch(r"0\.5\.23-[0-9a-f]{12}", sglang_venv.name)
        assert {v: env[v] for v in PER_BUILD_VARIABLES} == {
            "SGLANG_CACHE_DIR": build, "TORCH_EXTENSIONS_DIR": f"{build}/torch_extensions"}  # fmt: skip
        expected = {"HOME": home, "XDG_CACHE_HOME": cache, "TRITON_CACHE_DIR": f"{cache}/triton",
                    "FLASHINFER_WORKSPACE_BASE": f"{cache}/flashinfer",
                    "TILELANG_CACHE_DIR": f"{cache}/tilelang", "TVM_FFI_CACHE_DIR": f"{cache}/tvm-ffi",
                    "HF_HOME": f"{cache}/huggingface", "SGLANG_JIT_CACHE_DIR": f"{cache}/sglang-jit",
                    "TORCHINDUCTOR_CACHE_DIR": f"{cache}/torchinductor",
                    "CUDA_CACHE_PATH": f"{cache}/nv-compute"}  # fmt: skip
        assert {v: env[v] for v in expected} == expected
        assert env["HF_HUB_OFFLINE"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["CUDA_HOME"] == f"{lab}/usr/local/cuda-13.0"
        assert env["PATH"].split(":")[:2] == [f"{lab}/usr/local/cuda-13.0/bin", f"{sglang_venv}/bin"]
    router = _program(lab / "etc/pd-appliance/supervisor/conf.d/router.conf", "router")["env"]
    assert (router["HOME"], router["XDG_CACHE_HOME"]) == (home, cache)
    assert "TRITON_CACHE_DIR" not in router and "HF_HUB_OFFLINE" not in router, "smg loads no Python library"
    assert not (lab / "etc/pd-appliance/cuda.env").exists()


def test_the_role_makes_the_home_and_cache_tree_the_program_users_0750(lab: Path) -> None:
    home = lab / "var/lib/pd-appliance/home"
    build = next((home / "cache/sglang").iterdir())
    for directory in (home, home / "cache", home / "cache/sglang", build):
        st = directory.stat()
        # serving_secrets_owner is the invoking user here (as the program user is on a lab host).
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.getuid(), 0o750), directory


def test_a_cache_moved_where_the_user_cannot_write_is_refused(tmp_path: Path, repo_root: Path) -> None:
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({**_owner_vars(root), "serving_env_decode": {"HF_HOME": f"{blocker}/hf"}}))
    result = run_playbook("playbooks/serve.yml", repo_root / "inventory/lab", "--tags", "serving_render",
                          "-e", f"@{extra}", timeout=600)  # fmt: skip
    assert result.returncode != 0
    refusal = f"pd:decode HF_HOME={blocker}/hf: pd-appliance cannot write there"
    assert refusal in result.stdout, result.stdout[-3000:]
    assert not (root / "etc/pd-appliance/supervisor/conf.d/decode.conf").exists()


def workers_file(root: Path) -> list[dict]:
    """The workers of smg's discovery file (a render writes it with the programs)."""
    path = root / "var/lib/pd-appliance/serving/router-workers.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    return json.loads(path.read_text())["workers"]


def test_lab_router_reads_its_workers_from_a_file_and_keeps_the_key_out(lab: Path) -> None:
    r = _program(lab / "etc/pd-appliance/supervisor/conf.d/router.conf", "router")
    argv = r["argv"]
    assert argv[:4] == [f"{lab}/opt/pd-appliance/tools/bin/python", "-m", "pd_appliance.serving.launch",
                        f"--env-file={lab}/etc/pd-appliance/serving/router.env"]  # fmt: skip
    assert "--secret-arg=--api-key=SERVING_ROUTER_API_KEY" in argv
    assert not [a for a in argv if "192.0.2.10:3000" in a]  # no worker on the router's command line
    smg = argv[argv.index("--") + 1 :]
    assert smg[:8] == [f"{lab}/opt/pd-appliance/router/bin/smg", "launch", "--pd-disaggregation",
                       "--discovery-provider", "file", "--discovery-file",
                       f"{lab}/var/lib/pd-appliance/serving/router-workers.json", "--host"]  # fmt: skip
    assert workers_file(lab) == [
        {"url": "http://192.0.2.10:30000", "worker_type": "prefill", "bootstrap_port": 8998},
        {"url": "http://192.0.2.10:30001", "worker_type": "decode"},
    ]
    assert smg[smg.index("--port") + 1] == "8000" and smg[smg.index("--prometheus-port") + 1] == "29000"
    assert "--api-key" not in smg
    assert int(r["stopwaitsecs"]) > 30 and r["priority"] == "200"


def test_secrets_only_in_0600_env_files(lab: Path) -> None:
    for conf in (lab / "etc/pd-appliance").rglob("*.conf"):
        text = conf.read_text()
        assert HF_TOKEN not in text and API_KEY not in text, conf
    env_dir = lab / "etc/pd-appliance/serving"
    # The Hub token belongs to the checkpoint download only: no serving program gets it.
    assert not [p for p in env_dir.glob("*.env") if HF_TOKEN in p.read_text()]
    # The router key reaches the router and, since workers listen beyond loopback, the workers.
    for role in ("router", "prefill", "decode"):
        assert f"SERVING_ROUTER_API_KEY={API_KEY}" in (env_dir / f"{role}.env").read_text()
    for env_file in env_dir.glob("*.env"):
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600, env_file


def test_supervisord_socket_systemd_unit_and_wrapper(lab: Path) -> None:
    parser = UnhosedConfigParser()
    parser.read_string((lab / "etc/pd-appliance/supervisor/supervisord.conf").read_text())
    assert parser.get("unix_http_server", "chmod") == "0770"
    assert parser.get("unix_http_server", "file") == f"{lab}/run/pd-appliance/supervisor.sock"
    assert not parser.has_section("inet_http_server")
    assert parser.get("rpcinterface:pd_appliance", "supervisor.rpcinterface_factory").endswith(
        "make_rpcinterface"
    )
    group = UnhosedConfigParser()
    group.read_string((lab / "etc/pd-appliance/supervisor/conf.d/00-group-pd.conf").read_text())
    assert group.get("group:pd", "programs") == "prefill,decode,router"
    unit = (lab / "etc/systemd/system/pd-appliance-supervisor.service").read_text()
    assert f"ExecStart={lab}/opt/pd-appliance/tools/bin/supervisord --nodaemon -c" in unit
    assert "KillMode=mixed" in unit and "LimitMEMLOCK=infinity" in unit
    wrapper = (lab / "usr/local/bin/supervisorctl").read_text()
    assert f"-c {lab}/etc/pd-appliance/supervisor/supervisord.conf" in wrapper


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory, repo_root) -> Path:
    """The lab's two-host variant (inventory/lab/hosts.yml), its layout from the lab's host_vars."""
    base = tmp_path_factory.mktemp("twohost")
    inventory = two_host_layout({"appliance_root": str(base / "p")}, {"appliance_root": str(base / "d")})
    (base / "inventory").mkdir()
    (base / "inventory/hosts.yml").write_text(yaml.safe_dump(inventory))
    for part in ("group_vars", "host_vars"):
        (base / "inventory" / part).symlink_to(repo_root / "inventory/lab" / part)
    owner = _owner_vars(base / "unused")
    for key in ("appliance_root", "serving_supervisor_unit_path", "serving_advertise_host"):
        owner.pop(key)
    owner["serving_supervisor_manager"] = "direct"
    extra = base / "vars.json"
    extra.write_text(json.dumps(owner))
    result = run_playbook("playbooks/serve.yml", base / "inventory", "--tags", "serving_render",
                          "-e", f"@{extra}", timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return base


def test_two_host_variant_routes_over_both_decode_instances(two_hosts: Path) -> None:
    conf_d = "etc/pd-appliance/supervisor/conf.d"
    assert sorted(p.name for p in (two_hosts / "p" / conf_d).glob("*.conf")) == [
        "00-group-pd.conf", "prefill.conf", "router.conf"]  # fmt: skip
    assert sorted(p.name for p in (two_hosts / "d" / conf_d).glob("*.conf")) == [
        "00-group-pd.conf", "decode-0.conf", "decode-1.conf"]  # fmt: skip
    group = UnhosedConfigParser()
    group.read_string((two_hosts / "d" / conf_d / "00-group-pd.conf").read_text())
    assert group.get("group:pd", "programs") == "decode-0,decode-1"
    router = _program(two_hosts / "p" / conf_d / "router.conf", "router")["argv"]
    smg = router[router.index("--") + 1 :]
    assert smg[2:5] == ["--pd-disaggregation", "--discovery-provider", "file"]
    assert workers_file(two_hosts / "p") == [
        {"url": "http://192.0.2.11:30000", "worker_type": "prefill", "bootstrap_port": 8998},
        {"url": "http://192.0.2.12:30001", "worker_type": "decode"},
        {"url": "http://192.0.2.12:30002", "worker_type": "decode"},
    ]
    assert not (two_hosts / "d" / "var/lib/pd-appliance/serving/router-workers.json").exists()
    for name, gpus, port, node in (
        ("decode-0", "0,1,2,3", "30001", "0"),
        ("decode-1", "4,5,6,7", "30002", "1"),
    ):
        decode = _program(two_hosts / "d" / conf_d / f"{name}.conf", name)
        argv = decode["argv"]
        assert decode["env"]["CUDA_VISIBLE_DEVICES"] == gpus
        assert decode["env"]["UCX_NET_DEVICES"] == "mlx5_0:1"
        # The PD transfer's ZMQ sockets bind the address the decode serves on, not the default route's.
        assert decode["env"]["SGLANG_HOST_IP"] == "192.0.2.12"
        assert decode["env"]["UCX_TLS"].startswith("rc,")
        assert argv[argv.index("--port") + 1] == port and argv[argv.index("--tp-size") + 1] == "4"
        assert argv[argv.index("--host") + 1] == "0.0.0.0"
        assert argv[argv.index("--disaggregation-ib-device") + 1] == "mlx5_0"
        assert _numactl(argv) == ["/usr/bin/numactl", f"--cpunodebind={node}", f"--membind={node}", "--"]
        assert decode["stdout_logfile"].endswith(f"/var/log/pd-appliance/{name}.log")
    assert sorted(p.name for p in (two_hosts / "d/etc/pd-appliance/serving").glob("*.env")) == [
        "decode-0.env", "decode-1.env"]  # fmt: skip


# ---- layouts of one 8-GPU host beyond the default (serving_instances) ------------------------------
ONE_P_THREE_D = [
    {"role": "prefill", "gpus": [0, 1], "tp_size": 2, "port": 30000, "bootstrap_port": 8998},
    {"role": "decode", "gpus": [2, 3], "tp_size": 2, "port": 30001},
    {"role": "decode", "gpus": [4, 5], "tp_size": 2, "port": 30002,
     "env": {"PD_INSTANCE_HOOK": "decode-1 only"}, "extra_args": ["--max-running-requests", "24"]},
    {"role": "decode", "gpus": [6, 7], "tp_size": 2, "port": 30003},
]  # fmt: skip
TWO_P_TWO_D = [
    {"role": "prefill", "gpus": [0, 1], "tp_size": 2, "port": 30000, "bootstrap_port": 8998},
    {"role": "prefill", "gpus": [2, 3], "tp_size": 2, "port": 30002, "bootstrap_port": 8999},
    {"role": "decode", "gpus": [4, 5], "tp_size": 2, "port": 30001},
    {"role": "decode", "gpus": [6, 7], "tp_size": 2, "port": 30003},
]


def _render_layout(root: Path, layout: list[dict]) -> None:
    extra = root.parent / "vars.json"
    extra.write_text(json.dumps({**_owner_vars(root), "serving_instances": layout,
                                 "serving_decode_extra_args": ["--watchdog-timeout", "600"]}))  # fmt: skip
    result = run_playbook("playbooks/serve.yml", "inventory/lab", "--tags", "serving_render",
                          "-e", f"@{extra}", timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("layouts") / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    _render_layout(root, ONE_P_THREE_D)
    return root


def test_one_prefill_three_decode_instances_on_one_host(layouts: Path) -> None:
    conf_d = layouts / "etc/pd-appliance/supervisor/conf.d"
    group = UnhosedConfigParser()
    group.read_string((conf_d / "00-group-pd.conf").read_text())
    assert group.get("group:pd", "programs") == "prefill,decode-0,decode-1,decode-2,router"
    expected = {"prefill": ("0,1", "30000", "0"), "decode-0": ("2,3", "30001", "0"),
                "decode-1": ("4,5", "30002", "1"), "decode-2": ("6,7", "30003", "1")}  # fmt: skip
    for name, (gpus, port, node) in expected.items():
        p = _program(conf_d / f"{name}.conf", name)
        argv = p["argv"]
        assert p["env"]["CUDA_VISIBLE_DEVICES"] == gpus
        assert p["env"]["UCX_TLS"] == "cuda_ipc,cuda_copy,sm,self,tcp"
        assert argv[argv.index("--tp-size") + 1] == "2" and argv[argv.index("--port") + 1] == port
        assert _numactl(argv) == ["/usr/bin/numactl", f"--cpunodebind={node}", f"--membind={node}", "--"]
        assert argv[3] == f"--env-file={layouts}/etc/pd-appliance/serving/{name}.env"
        assert ("--watchdog-timeout" in argv) == name.startswith("decode")
    decode_1 = _program(conf_d / "decode-1.conf", "decode-1")
    assert decode_1["env"]["PD_INSTANCE_HOOK"] == "decode-1 only"
    assert decode_1["argv"][-4:] == ["--watchdog-timeout", "600", "--max-running-requests", "24"]
    assert "PD_INSTANCE_HOOK" not in _program(conf_d / "decode-0.conf", "decode-0")["env"]
    assert [(w["worker_type"], w["url"]) for w in workers_file(layouts)] == [
        ("prefill", "http://192.0.2.10:30000"), ("decode", "http://192.0.2.10:30001"),
        ("decode", "http://192.0.2.10:30002"), ("decode", "http://192.0.2.10:30003"),
    ]  # fmt: skip


def test_a_layout_change_drops_the_programs_it_no_longer_has(layouts: Path) -> None:
    _render_layout(layouts, TWO_P_TWO_D)
    conf_d = layouts / "etc/pd-appliance/supervisor/conf.d"
    assert sorted(p.name for p in conf_d.glob("*.conf")) == [
        "00-group-pd.conf",
        "decode-0.conf",
        "decode-1.conf",
        "prefill-0.conf",
        "prefill-1.conf",
        "router.conf",
    ]
    assert sorted(p.name for p in (layouts / "etc/pd-appliance/serving").glob("*.env")) == [
        "decode-0.env", "decode-1.env", "prefill-0.env", "prefill-1.env", "router.env"]  # fmt: skip
    assert [(w["worker_type"], w["url"], w.get("bootstrap_port")) for w in workers_file(layouts)] == [
        ("prefill", "http://192.0.2.10:30000", 8998), ("prefill", "http://192.0.2.10:30002", 8999),
        ("decode", "http://192.0.2.10:30001", None), ("decode", "http://192.0.2.10:30003", None),
    ]  # fmt: skip
    prefill_1 = _program(conf_d / "prefill-1.conf", "prefill-1")["argv"]
    assert prefill_1[prefill_1.index("--disaggregation-bootstrap-port") + 1] == "8999"
