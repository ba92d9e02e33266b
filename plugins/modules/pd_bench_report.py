#!/usr/bin/python
"""Ansible module pd_bench_report: gate the measurements and write the report (pd_appliance.bench)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_bench_report
short_description: Throughput/probe/error/regression gates, report.json + report.md + report.png
description:
  - Gates the running variant (I(selected_variant)) against I(thresholds) and, with
    I(regression_tolerance), against the last accepted run in I(history_path); writes every
    variant's figures, the gates and I(metadata) into I(out_dir). Never fails on a gate; it returns
    C(passed) and C(failure_message) so the play can fetch the report before failing.
  - With I(accept), a passed report becomes the new regression baseline (appended to the history).
  - Fails only on bad arguments. Reports C(changed=true) when it wrote the report; writes nothing
    in check mode.
options:
  measurements:
    description: pd_bench measurements, one per variant (may be empty).
    type: list
    elements: dict
    default: []
  selected_variant:
    description: Variant left running; its figures are gated.
    type: str
    default: deployed
  thresholds:
    description: "Minimum output tok/s per concurrency, e.g. C({1: 10.0, 16: 25.0})."
    type: dict
    required: true
  max_error_rate:
    description: Fraction of requests that may fail per level (0 = none).
    type: float
    default: 0
  regression_tolerance:
    description: Allowed fractional drop below the last accepted run; unset = off.
    type: float
  history_path:
    description: JSON-lines history of accepted runs.
    type: path
    required: true
  accept:
    description: Append a passed run to the history.
    type: bool
    default: true
  out_dir:
    description: Directory for report.json, report.md, report.png and runs/.
    type: path
    required: true
  metadata:
    description: Host, commit, GPUs, versions, env hooks in force.
    type: dict
    default: {}
  selection:
    description: pd_bench_select's C(selection), shown in the report.
    type: dict
  final_probe:
    description: Probe result after switching to I(selected_variant) at the end of an A/B; must pass.
    type: dict
  error:
    description: Why nothing was measured (when I(measurements) is empty).
    type: str
    default: ""
  plot:
    description: Draw report.png when matplotlib is importable.
    type: bool
    default: true
  targets:
    description: "The target line: output tok/s per concurrency, e.g. C({1: 210, 16: 1000}); never gated."
    type: dict
    default: {}
  decode_concurrency_levels:
    description: Levels whose decode concurrency is gated (decode's running requests must reach the level).
    type: list
    elements: int
    default: []
  engine_startup:
    description: >-
      What each worker's engine chose at start-up, C({host: {instance: record}}) as the serve stage
      recorded it (pd_appliance.serving.startup_log); a fallback named there fails the report.
    type: dict
    default: {}
  engine_startup_here:
    description: >-
      The measuring host's own records, read here (C({host, directory, names}): the serve stage's
      record directory on this host and its workers' names), merged into I(engine_startup): a
      delegated read would cost a module run.
    type: dict
    default: {}
  roofline:
    description:
      - >-
        The decode roofline beside the running variant's figures (pd_appliance.bench.roofline),
        C({model_dir, context_tokens, bandwidth_gb_s}): the checkpoint on this host, the tokens of
        context a request holds, and a bandwidth that overrides NVML's (0 = NVML's, from
        I(metadata.gpus)). Empty = no roofline. Never fails the report; an error is reported.
    type: dict
    default: {}
  search:
    description:
      - >-
        The tuner's declared search as it ran (pd_appliance.bench.search state): the report keeps its
        stages, what each kept, and every configuration not measured with why. Empty = no search.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Write the report
  pd_bench_report:
    measurements: "{{ validation_measurements }}"
    thresholds: {1: 10.0, 16: 25.0}
    history_path: /var/lib/pd-appliance/validation/history.jsonl
    out_dir: /var/lib/pd-appliance/validation
  register: validation_report
"""

RETURN = r"""
passed:
  description: Every gate passed.
  returned: success
  type: bool
failure_message:
  description: Measured vs limit for each failed gate (empty when passed).
  returned: success
  type: str
gates:
  description: name, passed, message, measured, limit of every gate.
  returned: success
  type: list
paths:
  description: json, markdown and png (null when not drawn) paths on the host.
  returned: success
  type: dict
accepted:
  description: The history entry written, or null.
  returned: success
  type: dict
report:
  description: The report as written to report.json (the controller writes its copy from it, without a fetch).
  returned: success, not in check mode
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.pd_module import tools_venv  # noqa: E402


def _thresholds(module: AnsibleModule, raw: dict, name: str = "thresholds") -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in raw.items():
        try:
            level, limit = int(key), float(value)
        except (TypeError, ValueError):
            module.fail_json(
                msg=f"{name}: {key!r}: {value!r} is not CONCURRENCY: TOK_S; set "
                + (
                    "validation_min_output_tok_s_bs1 / validation_min_output_tok_s_c16 to numbers"
                    if name == "thresholds"
                    else "validation_target_output_tok_s to {concurrency: tok/s}"
                )
            )
        out[level] = limit
    return out


def _roofline(report: dict, options: dict) -> dict:
    """The running variant's roofline section (pd_appliance.bench.roofline.report_section)."""
    from pd_appliance.bench.roofline import report_section

    running = next(v for v in report["variants"] if v.get("variant") == report["selected_variant"])
    return report_section(
        running,
        report.get("engine_startup") or {},
        (report.get("metadata") or {}).get("gpus") or [],
        options["model_dir"],
        int(options.get("context_tokens") or 0),
        float(options.get("bandwidth_gb_s") or 0.0),
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "measurements": {"type": "list", "elements": "dict", "default": []},
            "selected_variant": {"type": "str", "default": "deployed"},
            "thresholds": {"type": "dict", "required": True},
            "max_error_rate": {"type": "float", "default": 0.0},
            "regression_tolerance": {"type": "float"},
            "history_path": {"type": "path", "required": True},
            "accept": {"type": "bool", "default": True},
            "out_dir": {"type": "path", "required": True},
            "metadata": {"type": "dict", "default": {}},
            "selection": {"type": "dict"},
            "final_probe": {"type": "dict"},
            "error": {"type": "str", "default": ""},
            "plot": {"type": "bool", "default": True},
            "targets": {"type": "dict", "default": {}},
            "decode_concurrency_levels": {"type": "list", "elements": "int", "default": []},
            "engine_startup": {"type": "dict", "default": {}},
            "engine_startup_here": {"type": "dict", "default": {}},
            "roofline": {"type": "dict", "default": {}},
            "search": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    with tools_venv(module, "pd_appliance.bench is not importable ({err}): run with the tools venv"):
        from pd_appliance.bench import history
        from pd_appliance.bench.report import ReportError, accept, build_report, write_report
        from pd_appliance.serving.startup_log import read_records
    p = module.params
    here = p["engine_startup_here"]
    if here.get("host"):
        records = read_records(here["directory"], here["names"])
        p["engine_startup"] = {**p["engine_startup"], here["host"]: records}
    thresholds = _thresholds(module, p["thresholds"])
    last, history_error = None, ""
    try:
        last = history.last_accepted(p["history_path"])
    except history.HistoryError as err:
        history_error = str(err)
    try:
        report = build_report(
            p["measurements"],
            p["selected_variant"],
            thresholds,
            p["regression_tolerance"],
            last,
            p["metadata"],
            p["selection"],
            p["max_error_rate"],
            p["error"],
            history_error,
            p["final_probe"],
            _thresholds(module, p["targets"], "targets"),
            p["decode_concurrency_levels"],
            p["engine_startup"],
        )
    except ReportError as err:
        module.fail_json(msg=f"pd_bench_report: {err}")
    if p["roofline"].get("model_dir"):
        report["roofline"] = _roofline(report, p["roofline"])
    if p["search"]:
        from pd_appliance.bench.search import summary

        report["search"] = summary(p["search"])
    if module.check_mode:
        module.exit_json(changed=False, passed=report["passed"], failure_message=report["failure_message"],
                         gates=report["gates"], paths={}, accepted=None)  # fmt: skip
    paths = write_report(report, p["out_dir"], plot=p["plot"])
    entry = accept(report, p["history_path"]) if p["accept"] and report["passed"] else None
    module.exit_json(
        changed=True,
        passed=report["passed"],
        failure_message=report["failure_message"],
        gates=report["gates"],
        paths=paths,
        accepted=entry,
        figures=report["figures"],
        targets=report["targets"],
        report=report,
    )


if __name__ == "__main__":
    main()
