"""`pd-appliance`: run the appliance's playbooks through ansible-runner and keep every run.

Each run gets artifacts/runs/<UTC timestamp>-<command>/ with ansible-runner's job events and
stdout, and ends with a one-screen summary: stages, changed/failed counts per host, and the
validation figures if the run produced a report. The summary is built from the recorded events,
so it can be printed again later for any past run (`pd-appliance summary DIR`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pd_appliance import host_state, proofs

PLAYBOOKS = {
    "deploy": "site.yml",
    "validate": "playbooks/validate.yml",
    "status": "playbooks/day2/status.yml",
    "rollback": "playbooks/day2/rollback.yml",
}


def project_root() -> Path:
    """The checkout holding site.yml: $PD_APPLIANCE_ROOT, else the current directory or its parents."""
    env = os.environ.get("PD_APPLIANCE_ROOT")
    if env:
        return Path(env).resolve()
    here = Path.cwd().resolve()
    for candidate in (here, *here.parents):
        if (candidate / "site.yml").is_file() and (candidate / "ansible.cfg").is_file():
            return candidate
    raise SystemExit(
        "pd-appliance: no site.yml found here or above; run it from the appliance checkout "
        "or set PD_APPLIANCE_ROOT."
    )


@dataclass
class RunSummary:
    """What a run did, distilled from ansible-runner's job events."""

    status: str = "unknown"
    rc: int | None = None
    stages: list[str] = field(default_factory=list)
    hosts: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    # host -> the release line the status play printed (roles/release, tasks/status.yml)
    releases: dict[str, str] = field(default_factory=dict)
    # host -> its host state (ansible_local.pd_appliance) as the status play showed it, in one line
    host_states: dict[str, str] = field(default_factory=dict)
    # (host, controller path) of each validation report this run fetched (roles/validation, report.yml)
    reports: list[tuple[str, str]] = field(default_factory=list)
    # "host: line" for every proof a run skipped because its inputs had not changed (pd_appliance.proofs)
    skipped_proofs: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rc == 0


# The task of roles/release/tasks/status.yml whose message is a host's release line.
RELEASE_TASK = "Show the release"
# The task of playbooks/day2/status.yml whose message is a host's state (ansible_local.pd_appliance).
HOST_STATE_TASK = "Show the host state"
# The start of the line a skipped proof prints (pd_appliance.proofs); the summary lists the rest.
SKIP = proofs.SKIP_PREFIX + ": "
# The tasks of roles/validation/tasks/report.yml that put each report on the controller: the copy
# written from the module's result (its stdout names the paths), or the fetch when that could not run.
REPORT_COPY_TASK = "Write the report on the controller and draw its plot"
REPORT_FETCH_TASK = "Fetch the report to the controller"
REPORT_TASKS = (REPORT_COPY_TASK, REPORT_FETCH_TASK)


def _fetched_reports(res: dict[str, Any]) -> list[str]:
    """The report.json files a copy's stdout or a fetch loop's result names (each item's `dest`)."""
    if res.get("rc") == 0 and str(res.get("stdout", "")).startswith("{"):
        written = json.loads(res["stdout"]).get("json")
        return [str(written)] if written else []
    items = res.get("results") or [res]
    return [
        str(i["dest"])
        for i in items
        if isinstance(i, dict) and str(i.get("dest", "")).endswith("report.json")
    ]


def summarize_events(events: Iterable[dict[str, Any]]) -> RunSummary:
    """Build a RunSummary from job events (the dicts ansible-runner writes to job_events/)."""
    summary = RunSummary()
    for event in events:
        kind = event.get("event")
        data = event.get("event_data", {})
        if kind == "playbook_on_play_start":
            name = data.get("play") or data.get("name") or "play"
            if name not in summary.stages:
                summary.stages.append(name)
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            res = data.get("res", {})
            msg = res.get("msg", "")
            if isinstance(msg, list):
                msg = "; ".join(map(str, msg))
            summary.failures.append(f"{data.get('host')}: {data.get('task')}: {msg}".strip())
        elif kind == "runner_on_ok" and data.get("task") == RELEASE_TASK:
            msg = (data.get("res") or {}).get("msg")
            if msg:
                summary.releases[str(data.get("host"))] = str(msg)
        elif kind == "runner_on_ok" and data.get("task") == HOST_STATE_TASK:
            state = (data.get("res") or {}).get("msg")
            if isinstance(state, dict):
                summary.host_states[str(data.get("host"))] = host_state.describe(state)
        elif kind == "runner_on_ok" and str(data.get("task", "")).endswith(REPORT_TASKS):
            host = str(data.get("host"))
            fetched = [(host, r) for r in _fetched_reports(data.get("res") or {})]
            summary.reports += [r for r in fetched if r not in summary.reports]
        elif kind == "runner_on_ok" and str((data.get("res") or {}).get("msg", "")).startswith(
            proofs.SKIP_PREFIX
        ):
            line = f"{data.get('host')}: {str(data['res']['msg'])[len(proofs.SKIP_PREFIX) + 2 :]}"
            if line not in summary.skipped_proofs:
                summary.skipped_proofs.append(line)
        elif kind == "runner_on_unreachable":
            summary.failures.append(f"{data.get('host')}: unreachable during {data.get('task')}")
        elif kind == "playbook_on_stats":
            for key in ("ok", "changed", "failures", "unreachable", "skipped", "rescued", "ignored"):
                for host, count in (data.get(key) or {}).items():
                    summary.hosts.setdefault(host, {})[key] = count
    return summary


def read_events(run_dir: Path) -> Iterator[dict[str, Any]]:
    """Job events of a finished run, in order."""
    event_files = sorted(
        run_dir.glob("artifacts/*/job_events/*.json"),
        key=lambda p: int(p.name.split("-", 1)[0]) if p.name.split("-", 1)[0].isdigit() else 0,
    )
    for path in event_files:
        try:
            yield json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue


def validation_figures(reports: Iterable[tuple[str, str]]) -> list[str]:
    """One line per gate of each validation report this run fetched to the controller (wherever
    validation_artifacts_dir put it): a report another run left behind says nothing about this one."""
    lines = []
    for fetched_by, path in reports:
        report = Path(path)
        try:
            data = json.loads(report.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        verdict = "PASS" if data.get("passed") else "FAIL"
        for host, rel in sorted(((data.get("metadata") or {}).get("release") or {}).items()):
            lines.append(f"  {fetched_by}: release on {host}: {rel.get('id')} ({rel.get('status')})")
        lines += [f"  {fetched_by}: {gate_figure(gate)}" for gate in data.get("gates", [])]
        lines.append(f"  {fetched_by}: validation {verdict} ({report})")
    return lines


def gate_figure(gate: Mapping[str, Any]) -> str:
    """A gate in one line: a threshold gate by its figure and limit, a check without figures (an
    engine's start-up: no fallback in its log) by its message, not "None (limit None)"."""
    verdict = "ok" if gate.get("passed") else "FAILED"
    measured, limit = gate.get("measured"), gate.get("limit")
    if measured is None and limit is None:
        return f"{gate.get('name')}: {verdict} ({gate.get('message') or 'no figure'})"
    bound = "" if limit is None else f" (limit {limit})"
    return f"{gate.get('name')}: {measured}{bound} {verdict}"


def render_summary(summary: RunSummary, run_dir: Path) -> str:
    """The one screen a user reads at the end of a run."""
    width = 72
    out = ["=" * width, f"pd-appliance run: {summary.status} (rc={summary.rc})", f"artifacts: {run_dir}"]
    out.append("stages: " + (" -> ".join(summary.stages) if summary.stages else "(none ran)"))
    if summary.hosts:
        out.append(f"{'host':<24}{'ok':>6}{'changed':>9}{'failed':>8}{'unreach':>9}{'skipped':>9}")
        for host, c in sorted(summary.hosts.items()):
            out.append(
                f"{host:<24}{c.get('ok', 0):>6}{c.get('changed', 0):>9}{c.get('failures', 0):>8}"
                f"{c.get('unreachable', 0):>9}{c.get('skipped', 0):>9}"
            )
    if summary.failures:
        out.append("failures:")
        out += [f"  {f}"[:400] for f in summary.failures[:10]]
    if summary.host_states:
        out.append("host state (ansible_local.pd_appliance):")
        out += [f"  {host}: {line}"[:400] for host, line in sorted(summary.host_states.items())]
    if summary.releases:
        out.append("releases:")
        out += [f"  {host}: {line}"[:400] for host, line in sorted(summary.releases.items())]
    if summary.skipped_proofs:
        out.append("skipped proofs (inputs unchanged; --force-checks runs them):")
        out += [f"  {line}"[:400] for line in summary.skipped_proofs]
    figures = validation_figures(summary.reports)
    if figures:
        out.append("validation:")
        out += figures
    out.append("=" * width)
    return "\n".join(out)


def new_run_dir(root: Path, command: str) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    run_dir = root / "artifacts" / "runs" / f"{stamp}-{command}"
    run_dir.mkdir(parents=True, exist_ok=False)
    return run_dir


def runner_env(root: Path) -> dict[str, str]:
    """The environment ansible-runner starts ansible-playbook with: the repository's ansible.cfg and
    callback plugins, this venv's tools first on PATH, no colour in the recorded output."""
    bin_dir = str(Path(sys.executable).parent)
    return {
        "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
        # ansible-runner replaces ansible.cfg's callback_plugins with its own directory, appended to
        # this variable: keep the appliance's (plugins/callback/pd_plugin_preload.py) in front.
        "ANSIBLE_CALLBACK_PLUGINS": str(root / "plugins" / "callback"),
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
    }


def run_playbook(
    root: Path,
    command: str,
    inventory: str,
    extra_args: Sequence[str] = (),
    quiet: bool = False,
) -> tuple[RunSummary, Path]:
    """Run one appliance playbook with ansible-runner, recording artifacts under artifacts/runs/."""
    import ansible_runner  # imported here: the rest of the CLI works without it

    inventory_path = Path(inventory)
    if not inventory_path.is_absolute():
        inventory_path = (Path.cwd() / inventory_path).resolve()
    if not inventory_path.exists():
        raise SystemExit(f"pd-appliance: inventory {inventory} does not exist (try inventory/rehearsal).")
    run_dir = new_run_dir(root, command)
    env = runner_env(root)
    result = ansible_runner.run(
        private_data_dir=str(run_dir),
        project_dir=str(root),
        playbook=str(root / PLAYBOOKS[command]),
        inventory=str(inventory_path),
        cmdline=" ".join(_quote(a) for a in extra_args) or None,
        envvars=env,
        quiet=quiet,
        ident="run",
    )
    scrub_secrets(run_dir)
    summary = summarize_events(read_events(run_dir))
    summary.status, summary.rc = result.status, result.rc
    return summary, run_dir


SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|CREDENTIAL|PRIVATE)", re.IGNORECASE)


def scrub_secrets(run_dir: Path) -> None:
    """Redact secret-looking environment values that ansible-runner copies into the run's files.

    ansible-runner records the whole process environment (artifacts/<ident>/command, env/envvars);
    an operator's HF_TOKEN exported in the shell must not end up in a run directory that gets
    attached to a bug report.
    """
    for path in [*run_dir.glob("artifacts/*/command"), *run_dir.glob("env/envvars")]:
        try:
            data = json.loads(path.read_text()) if path.name == "command" else None
        except (OSError, json.JSONDecodeError):
            continue
        if data and isinstance(data.get("env"), dict):
            data["env"] = {k: ("<redacted>" if SECRET_NAME.search(k) else v) for k, v in data["env"].items()}
            path.write_text(json.dumps(data))


def private_extra_vars(values: Sequence[str]) -> dict[str, Any]:
    """Merge `-e` values (key=value words, JSON or YAML mappings, @file) into one mapping.

    pd-appliance hands extra variables to ansible-playbook in a 0600 file instead of on its command
    line: ansible-runner records the command line in the run directory (env/cmdline,
    artifacts/*/command), and `-e checkpoint_hf_token=...` must not end up there or in /proc.
    """
    import shlex

    import yaml

    merged: dict[str, Any] = {}
    for value in values:
        text = value.strip()
        if text.startswith("@"):
            loaded = yaml.safe_load(Path(text[1:]).read_text())
        elif text.startswith(("{", "[")):
            loaded = yaml.safe_load(text)
        else:
            loaded = {}
            for word in shlex.split(text):
                key, sep, item = word.partition("=")
                if not sep:
                    raise SystemExit(f"pd-appliance: -e {word!r}: expected key=value, JSON or @file")
                loaded[key] = item
        if not isinstance(loaded, dict):
            raise SystemExit(f"pd-appliance: -e {value[:40]!r} is not a mapping of variables")
        merged.update(loaded)
    return merged


def secret_values(variables: dict[str, Any]) -> list[str]:
    """The values of secret-looking variables (by name), to scrub from anything a run writes."""
    return [
        str(v) for k, v in variables.items() if SECRET_NAME.search(k) and isinstance(v, str | int) and str(v)
    ]


def scrub_values(run_dir: Path, secrets: Sequence[str]) -> None:
    """Replace every occurrence of a secret value in the run's files (events echo what tasks print)."""
    needles = [s.encode() for s in secrets if len(s) >= 4]
    if not needles:
        return
    for path in run_dir.rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes()
        cleaned = data
        for needle in needles:
            cleaned = cleaned.replace(needle, b"<redacted>")
        if cleaned != data:
            path.write_bytes(cleaned)


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pd-appliance", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("deploy", "run site.yml: preflight, provision, checkpoint, serve, validate"),
        ("validate", "run the validation stage alone (throughput gates)"),
        ("status", "show the release, the programs, health and GPU memory (playbooks/day2/status.yml)"),
        ("rollback", "put the last accepted release back and validate it (playbooks/day2/rollback.yml)"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument(
            "-i", "--inventory", default="inventory/rehearsal", help="inventory (default: rehearsal)"
        )
        p.add_argument("--tags", help="only these stages/tags, comma separated")
        p.add_argument("--limit", help="only these hosts")
        p.add_argument("-e", "--extra-vars", action="append", default=[], help="extra variables (repeatable)")
        p.add_argument("--check", action="store_true", help="dry run (ansible --check --diff)")
        p.add_argument("-q", "--quiet", action="store_true", help="print only the summary")
        p.add_argument(
            "--force-checks",
            action="store_true",
            help="run every proof (lock proof, NIXL check, wheel build) even when its inputs are unchanged",
        )
    s = sub.add_parser("summary", help="print the summary of a recorded run again")
    s.add_argument("run_dir", type=Path)
    return parser


def extra_args_from(ns: argparse.Namespace, vars_file: Path | None = None) -> list[str]:
    """ansible-playbook arguments; extra variables only as `-e @vars_file` (see private_extra_vars)."""
    args: list[str] = []
    if ns.tags:
        args += ["--tags", ns.tags]
    if ns.limit:
        args += ["--limit", ns.limit]
    if vars_file is not None:
        args += ["-e", f"@{vars_file}"]
    if ns.check:
        args += ["--check", "--diff"]
    return args


def run_variables(ns: argparse.Namespace) -> dict[str, Any]:
    """The run's extra variables: the user's `-e` values, and appliance_force_checks=true for
    --force-checks (every proof runs although its inputs are unchanged: pd_appliance.proofs)."""
    variables = private_extra_vars(ns.extra_vars)
    if ns.force_checks:
        variables["appliance_force_checks"] = True
    return variables


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    root = project_root()
    if ns.command == "summary":
        summary = summarize_events(read_events(ns.run_dir))
        status_file = ns.run_dir / "artifacts" / "run" / "status"
        rc_file = ns.run_dir / "artifacts" / "run" / "rc"
        summary.status = status_file.read_text().strip() if status_file.exists() else "unknown"
        summary.rc = int(rc_file.read_text()) if rc_file.exists() else None
        print(render_summary(summary, ns.run_dir))
        return 0 if summary.ok else 1
    variables = run_variables(ns)
    with tempfile.TemporaryDirectory(prefix="pd-appliance-") as private:
        vars_file = None
        if variables:
            vars_file = Path(private) / "extra-vars.json"
            vars_file.touch(mode=0o600)
            vars_file.write_text(json.dumps(variables))
        summary, run_dir = run_playbook(
            root, ns.command, ns.inventory, extra_args_from(ns, vars_file), quiet=ns.quiet
        )
    scrub_values(run_dir, secret_values(variables))
    print(render_summary(summary, run_dir))
    return 0 if summary.ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
