"""The serving planner: every supervisor program of a host, as data (argv, env, priority, notes).

The serving role hands the planner its variables once (roles/serving/tasks/check_inputs.yml, filter
pd_serving_program_specs): every `serving_*` variable by name (`PlanInputs.settings`, gathered by
prefix, secrets left out), this host's published topology, its GPU bindings and health URLs. The
templates only format what it returns (program.conf.j2). Changing how a worker or the router is
launched is a change to the variable (the role's defaults and argument spec), here or in
pd_appliance.serving.commands (the flag spelling), and in their tests: no line in the role's vars/,
no Jinja program (this replaced templates/program_spec.j2 and the role's computed dicts).

What the planner reads from `settings` (`_launch`):
- the engine's and the router's command line settings: the `serving_*` variables with the prefix
  taken off (`serving_router_*` for the router), handed to commands.sglang_argv / router_argv, so a
  new `serving_decode_<x>` reaches sglang_argv as `decode_<x>` without a line anywhere else; a few
  are renamed or grouped here (the bind host, the speculative settings, each role's CUDA graph size);
- the env-hook layers, merged left to right (pd_appliance.serving.supervisor_format.merge_env);
- supervisor's settings per kind of program and where logs and env files live.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pd_appliance.serving import commands
from pd_appliance.serving.supervisor_format import merge_env

ROUTER = "router"
PREFIX = "serving_"
ROUTER_PREFIX = "serving_router_"
# Env switches only one worker role reads, so a change restarts only that role: variable -> the
# setting it comes from, by role. An aggregated engine decodes too, so it reads the decode backend.
ROLE_ONLY_ENV: Mapping[str, Mapping[str, str]] = {
    "prefill": {},
    "decode": {"SGLANG_SM120_FLASHMLA_BACKEND": "serving_sglang_sm120_flashmla_backend"},
    "aggregated": {"SGLANG_SM120_FLASHMLA_BACKEND": "serving_sglang_sm120_flashmla_backend"},
}


@dataclass(frozen=True)
class Supervision:
    """supervisor's start and stop settings for one kind of program."""

    priority: int
    startsecs: int
    stopwaitsecs: int


@dataclass(frozen=True)
class PlanInputs:
    """What the serving role hands the planner (see the module doc)."""

    # Every serving_* variable of the host by its full name (the role leaves secrets out).
    settings: Mapping[str, Any]
    # The tools venv's python, which runs the launcher (pd_appliance.serving.launch).
    tools_python: str
    # This host's instances (pd_serving_topology, pd_appliance.serving.topology's published form).
    instances: Sequence[Mapping[str, Any]]
    # By program name: pd_appliance.serving.pinning.gpu_binding of its GPUs.
    bindings: Mapping[str, Mapping[str, Any]]
    # By program name: where the play probes it (health_urls below, as the role's vars hold them).
    health_urls: Mapping[str, str]
    # Every instance of the deployment: a router host routes over them.
    all_instances: Sequence[Mapping[str, Any]] = ()

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> PlanInputs:
        """From the role's dict (plain JSON-able values)."""
        return cls(**raw)


@dataclass(frozen=True)
class _Launch:
    """What the planner derives from the settings once (`_launch`)."""

    env_dir: str
    log_dir: str
    launcher: Sequence[str]
    instances: Mapping[str, Mapping[str, Any]]
    bindings: Mapping[str, Mapping[str, Any]]
    health_urls: Mapping[str, str]
    engine_command: Sequence[str]
    # The engine settings every worker shares (commands.sglang_argv's keys).
    worker_settings: Mapping[str, Any]
    # By role; an aggregated engine captures both phases: {"prefill": N, "decode": N} (commands.sglang_argv).
    cuda_graph_max_bs: Mapping[str, Any]
    extra_args: Mapping[str, Sequence[str]]
    numactl_path: str
    numa_binding: bool
    require_api_key: bool
    worker: Supervision
    router: Supervision
    # Env-hook layers by name: defaults_common, common, defaults_workers, defaults_router, router,
    # host, and per worker role: role_only[role], user[role].
    env: Mapping[str, Any]
    all_instances: Sequence[Mapping[str, Any]]
    router_command: Sequence[str]
    router_settings: Mapping[str, Any]


def _stripped(settings: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The settings under `prefix`, keyed without it (serving_kv_cache_dtype -> kv_cache_dtype)."""
    return {name[len(prefix) :]: value for name, value in settings.items() if name.startswith(prefix)}


def _supervision(s: Mapping[str, Any], kind: str) -> Supervision:
    """supervisor's settings of a kind of program (worker, router): serving_<kind>_priority, ..."""
    return Supervision(
        *(int(s[f"serving_{kind}_{key}"]) for key in ("priority", "startsecs", "stopwaitsecs"))
    )


def _worker_settings(s: Mapping[str, Any]) -> dict[str, Any]:
    """commands.sglang_argv's settings: every serving_* variable without the prefix, the bind host
    as `host` and the speculative settings grouped (each instance adds its own: _worker_spec)."""
    return {
        **_stripped(s, PREFIX),
        "host": s["serving_worker_bind_host"],
        "speculative": {
            "algorithm": s["serving_speculative_algorithm"],
            "num_steps": s["serving_speculative_num_steps"],
            "eagle_topk": s["serving_speculative_eagle_topk"],
            "num_draft_tokens": s["serving_speculative_num_draft_tokens"],
        },
    }


def router_settings(s: Mapping[str, Any]) -> dict[str, Any]:
    """commands.router_argv's settings: every serving_router_* variable without the prefix, and the
    metrics address, the outage grace and the log level under router_argv's names. Public: a host's
    own gate (pd_appliance.serving.host_gate) starts a private smg from the same settings."""
    return {
        **_stripped(s, ROUTER_PREFIX),
        "prometheus_host": s["serving_router_host"],
        "prometheus_port": s["serving_router_metrics_port"],
        "outage_grace_s": s["serving_router_worker_outage_grace_s"],
        "log_level": s["serving_log_level"],
    }


def _launch(p: PlanInputs) -> _Launch:
    """Everything the programs' specs read, from the settings (see the module doc)."""
    s = p.settings
    graphs = {role: s[f"serving_{role}_cuda_graph_max_bs"] for role in ("prefill", "decode")}
    roles = (*commands.WORKER_ROLES, ROUTER)
    return _Launch(
        env_dir=s["serving_env_dir"],
        log_dir=s["serving_log_dir"],
        launcher=[p.tools_python, "-m", "pd_appliance.serving.launch"],
        instances={str(i["name"]): i for i in p.instances},
        bindings=p.bindings,
        health_urls=p.health_urls,
        engine_command=s["serving_engine_command"],
        worker_settings=_worker_settings(s),
        cuda_graph_max_bs={**graphs, "aggregated": graphs},
        extra_args={role: s[f"serving_{role}_extra_args"] for role in roles},
        numactl_path=s["serving_numactl_path"],
        numa_binding=bool(s["serving_numa_binding"]),
        require_api_key=bool(s["serving_worker_require_api_key"]),
        worker=_supervision(s, "worker"),
        router=_supervision(s, "router"),
        env={
            "defaults_common": s["serving_env_defaults_common"],
            "common": s["serving_env_common"],
            "defaults_workers": s["serving_env_defaults_workers"],
            "defaults_router": s["serving_env_defaults_router"],
            "router": s["serving_env_router"],
            "host": s["serving_env_host"],
            # An empty switch leaves the variable to SGLang (null removes it from the merge).
            "role_only": {
                role: {k: s[v] or None for k, v in only.items()} for role, only in ROLE_ONLY_ENV.items()
            },
            "user": {role: s[f"serving_env_{role}"] for role in roles},
        },
        all_instances=p.all_instances,
        router_command=s["serving_router_command"],
        router_settings=router_settings(s),
    )


def program_specs(names: Sequence[str], raw: Mapping[str, Any] | PlanInputs) -> dict[str, dict[str, Any]]:
    """Each named program's spec (a worker instance's name, or `router`), in the order given."""
    launch = _launch(raw if isinstance(raw, PlanInputs) else PlanInputs.from_mapping(raw))
    return {name: program_spec(name, launch) for name in names}


def program_spec(name: str, p: _Launch) -> dict[str, Any]:
    """One program: argv, environment, env file, log, health URL, supervisor settings and notes."""
    env_file = f"{p.env_dir}/{name}.env"
    spec = _router_spec(p, env_file) if name == ROUTER else _worker_spec(name, p, env_file)
    return {**spec, "name": name, "env_file": env_file, "log": f"{p.log_dir}/{name}.log"}


def _router_spec(p: _Launch, env_file: str) -> dict[str, Any]:
    prefills = [i for i in p.all_instances if i["role"] == "prefill"]
    decodes = [i for i in p.all_instances if i["role"] == "decode"]
    aggregated = [i for i in p.all_instances if i["role"] == "aggregated"]
    workers = {"prefill": prefills, "decode": decodes, "aggregated": aggregated}
    engine = commands.router_argv(p.router_command, {**p.router_settings, **workers})
    # No worker on this command line (not even the launcher's --wait-for): smg reads them from the
    # discovery file the play writes once they are healthy, so a fleet change leaves this program alone.
    launcher = [*p.launcher, f"--env-file={env_file}", "--secret-arg=--api-key=SERVING_ROUTER_API_KEY"]
    env = p.env
    mode = (
        f"smg regular mode ({p.router_settings.get('aggregated_policy')})" if aggregated else "smg PD router"
    )
    routes = (
        f"{mode} over the workers of {p.router_settings.get('discovery_file')} (smg's file discovery, "
        "reread live: the play rewrites it when the fleet changes, smg is not restarted)"
    )
    return {
        "priority": p.router.priority,
        "startsecs": p.router.startsecs,
        "stopwaitsecs": p.router.stopwaitsecs,
        "health_url": p.health_urls[ROUTER],
        "argv": [*launcher, "--", *engine],
        "environment": merge_env(
            env["defaults_common"], env["common"], env["defaults_router"], env["router"], env["host"]
        ),
        "notes": [routes],
    }


def _worker_spec(name: str, p: _Launch, env_file: str) -> dict[str, Any]:
    inst = p.instances[name]
    role = inst["role"]
    binding = p.bindings[name]
    settings = {
        **p.worker_settings,
        "tp_size": inst["tp_size"],
        "port": inst["port"],
        "bootstrap_port": inst["bootstrap_port"],
        "cuda_graph_max_bs": p.cuda_graph_max_bs[role],
        "extra_args": [*p.extra_args[role], *inst["extra_args"]],
    }
    engine = commands.sglang_argv(p.engine_command, role, settings)
    numactl = [p.numactl_path, *binding["numactl_args"], "--"] if binding["numactl_args"] else []
    launcher = [*p.launcher, f"--env-file={env_file}"]
    if p.require_api_key:
        launcher.append("--secret-arg=--api-key=SERVING_ROUTER_API_KEY")
    env = p.env
    environment = merge_env(
        env["defaults_common"],
        env["common"],
        env["defaults_workers"],
        env["role_only"][role],
        env["user"][role],
        env["host"],
        inst["env"],
        {"CUDA_VISIBLE_DEVICES": binding["cuda_visible_devices"]},
    )
    return {
        "priority": p.worker.priority,
        "startsecs": p.worker.startsecs,
        "stopwaitsecs": p.worker.stopwaitsecs,
        "health_url": p.health_urls[name],
        "gpus": binding["cuda_visible_devices"],
        "numa_nodes": binding["numa_nodes"],
        "role": role,
        "argv": [*launcher, "--", *(numactl if p.numa_binding and numactl else []), *engine],
        "environment": environment,
        "notes": _worker_notes(inst, binding, numactl, p.numa_binding),
    }


def _worker_notes(
    inst: Mapping[str, Any], binding: Mapping[str, Any], numactl: list[str], numa_binding: bool
) -> list[str]:
    """What the section's comments say about the instance, its GPUs and its NUMA binding."""
    bootstrap = f", bootstrap port {inst['bootstrap_port']}" if inst["bootstrap_port"] else ""
    stand_in = binding.get("stand_in")
    nodes = ",".join(map(str, binding["numa_nodes"]))
    notes = [
        f"{inst['role']} instance, TP{inst['tp_size']}, port {inst['port']}{bootstrap} (serving_instances)",
        f"GPUs {binding['cuda_visible_devices']} (CUDA_VISIBLE_DEVICES)"
        + (f" [STAND-IN: {stand_in}]" if stand_in else ""),
    ]
    if numactl and numa_binding and stand_in:
        bound = ",".join(map(str, binding["bind_numa_nodes"]))
        notes.append(
            f"STAND-IN ({stand_in}): the GPUs report NUMA node(s) {nodes}; bound to this machine's node(s) "
            f"{bound}: {' '.join(numactl)} (CPU and memory binding)"
        )
    elif numactl and numa_binding:
        notes.append(f"NUMA node(s) {nodes}: {' '.join(numactl)} (CPU and memory binding)")
    elif numactl:
        notes.append(f"no NUMA binding (serving_numa_binding is false); NUMA node(s) {nodes}")
    elif stand_in and not binding["gpus_without_numa_node"]:
        notes.append(
            f"STAND-IN ({stand_in}): no NUMA binding: this machine reports no NUMA node for the GPUs' "
            f"node(s) {nodes}"
        )
    else:
        unknown = ",".join(map(str, binding["gpus_without_numa_node"]))
        notes.append(f"no NUMA binding: the facts give no NUMA node for GPUs {unknown}")
    if binding.get("spans_numa_nodes"):
        notes.append(f"WARNING: these GPUs span NUMA nodes {nodes}; pick GPUs of one node for local memory")
    return notes


def worker_base_urls(instances: Sequence[Mapping[str, Any]], probe_host: str) -> dict[str, str]:
    """Where the play reaches each instance of this host: at `probe_host` (what the workers bind, or
    what the router dials when they bind every address), so its checks take the router's path."""
    return {str(inst["name"]): commands.worker_url(probe_host, inst["port"]) for inst in instances}


def health_urls(
    instances: Sequence[Mapping[str, Any]], probe_host: str, worker_health_path: str, router_url: str
) -> dict[str, str]:
    """Each program's health URL by name: the router's readiness, every instance's health path."""
    bases = worker_base_urls(instances, probe_host)
    return {ROUTER: router_url, **{name: url + worker_health_path for name, url in bases.items()}}


def dial_targets(all_instances: Sequence[Mapping[str, Any]]) -> list[str]:
    """What a router host must reach, as `label=host:port`: every instance, and every prefill's
    bootstrap port (the KV handshake)."""
    out = []
    for inst in all_instances:
        netloc = urlsplit(str(inst["url"]))
        out.append(f"pd:{inst['name']}@{inst['host']}={netloc.netloc}")
        if inst["role"] == "prefill":
            out.append(
                f"bootstrap of pd:{inst['name']}@{inst['host']}={netloc.hostname}:{inst['bootstrap_port']}"
            )
    return out


def release_programs(programs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each program's role and health URL, for the release record and the rollout."""
    return {
        name: {"role": spec.get("role", name), "health_url": spec["health_url"]}
        for name, spec in programs.items()
    }
