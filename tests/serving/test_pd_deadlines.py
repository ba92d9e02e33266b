"""SGLang's PD deadlines as the serving role renders them, and smg's admission wait kept under them.

README ("Faults"): the prefill frees an unbootstrapped request's KV after 120 s, the decode a request
whose KV never came after 120 s, and the decode pings each prefill every 2 s, failing the requests
waiting on one that misses 3 in a row; `--pd-admission-wait-secs` stays 30 s, well under the bootstrap
deadline (the play refuses half of it or more). The workers' env is rendered here through the same
Python the role's templates call (supervisor_format.merge_env and supervisor_environment), from the
role's defaults, and read back with supervisor's own parser.
"""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
import yaml
from supervisor.datatypes import dict_of_key_value_pairs

from pd_appliance.serving import commands, supervisor_format

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = yaml.safe_load((ROOT / "roles/serving/defaults/main.yml").read_text())
DEADLINES = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "120",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "120",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "3",
}


def _worker_env(overrides: dict | None = None) -> dict[str, str]:
    """serving_env_defaults_workers' SGLANG_DISAGGREGATION_* entries, templated against the role's
    defaults (plus `overrides`, as an inventory would set them), merged and rendered as the program's
    `environment=` line, then parsed back by supervisor."""
    context = {**DEFAULTS, **(overrides or {})}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    hook = {
        name: env.from_string(str(value)).render(context)
        for name, value in DEFAULTS["serving_env_defaults_workers"].items()
        if name.startswith("SGLANG_DISAGGREGATION_")
    }
    line = supervisor_format.supervisor_environment(supervisor_format.merge_env(hook))
    return dict_of_key_value_pairs(line)


def test_the_rendered_pd_deadlines_are_120_120_2_3() -> None:
    env = _worker_env()
    assert {name: env[name] for name in DEADLINES} == DEADLINES
    # They are the serving_pd_* knobs, not constants: an inventory's value is what the workers get.
    assert (
        _worker_env({"serving_pd_bootstrap_timeout_s": 90})["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] == "90"
    )


def test_the_shipped_admission_wait_is_well_under_the_bootstrap_deadline() -> None:
    wait, bootstrap = (
        DEFAULTS["serving_router_pd_admission_wait_secs"],
        DEFAULTS["serving_pd_bootstrap_timeout_s"],
    )
    assert (wait, bootstrap) == (30, 120)
    assert commands.admission_wait_errors("router1", wait, bootstrap) == []
    argv = commands.router_argv(
        ["smg", "launch"],
        {"prefill": [{"url": "http://10.0.0.1:30000", "bootstrap_port": 8998}],
         "decode": [{"url": "http://10.0.0.2:30001"}], "host": "127.0.0.1", "port": 8000,
         "pd_admission_wait_secs": wait, "discovery_file": "/srv/pd/router-workers.json"},
    )  # fmt: skip
    assert argv[argv.index("--pd-admission-wait-secs") + 1] == "30"


@pytest.mark.parametrize(
    ("wait", "refused"), [(60, True), (61, True), (120, True), (59, False), (59.9, False)]
)
def test_an_admission_wait_of_half_the_bootstrap_timeout_or_more_is_refused(
    wait: float, refused: bool
) -> None:
    errors = commands.admission_wait_errors("router1", wait, 120)
    assert bool(errors) is refused
    if refused:
        assert errors[0].startswith(
            f"router1: serving_router_pd_admission_wait_secs={wait} is not well under"
        )
        assert "serving_pd_bootstrap_timeout_s=120" in errors[0] and "below half" in errors[0]


def test_the_serving_role_applies_that_rule_on_the_router_host() -> None:
    """roles/serving/tasks/check_inputs.yml asserts the rule's result, so the play stops on a refused wait."""
    tasks = yaml.safe_load((ROOT / "roles/serving/tasks/check_inputs.yml").read_text())
    task = next(t for t in tasks if t["name"].startswith("Keep smg's PD admission wait"))
    assert task["ansible.builtin.assert"]["that"] == "__serving_admission_errors | length == 0"
    expression = " ".join(task["vars"]["__serving_admission_errors"].split())
    rule = "pd_serving_admission_wait_errors(serving_router_pd_admission_wait_secs, "
    assert rule + "serving_pd_bootstrap_timeout_s)" in expression
