"""smg's fault settings: the outage grace sizes retries and the health threshold; argv spelling.

The retry arithmetic is smg 1.13's RetryExecutor: the attempt count includes the first, and the
backoff after attempt a is min(initial * multiplier**a, max), +-jitter. The rendered argv is read
back with smg 1.13's own CLI parser (the router venv's smg, files/locks/router), and the retry window
is computed from the values smg parsed. tests/faults' lab-length decode restart (60 s) shows the
retries in action: every request sent during the outage is answered (it does not measure the window).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pd_appliance.serving.commands import (
    CommandError,
    health_failure_threshold_for,
    retry_attempts_for,
    retry_delays_ms,
    retry_window_s,
    router_argv,
)
from pd_testlib import reserve_ports

ROOT = Path(__file__).resolve().parents[2]
BASE = {
    "prefill": [{"url": "http://10.0.0.1:30000", "bootstrap_port": 8998}],
    "decode": [{"url": "http://10.0.0.2:30001"}],
    "host": "127.0.0.1", "port": 8000, "health_check_interval_secs": 10,
    "discovery_file": "/srv/pd/router-workers.json",
}  # fmt: skip
FAULTS = {
    "outage_grace_s": 300, "retry_initial_backoff_ms": 100, "retry_max_backoff_ms": 2000,
    "retry_backoff_multiplier": 2.0, "retry_jitter_factor": 0.2, "health_success_threshold": 1,
    "circuit_breaker": False, "remove_unhealthy_workers": False, "pd_admission_wait_secs": 30,
}  # fmt: skip


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_backoff_follows_smg() -> None:
    assert retry_delays_ms(5, 50, 30000, 1.5) == [50, 75, 112.5, 168.75]
    assert retry_delays_ms(1, 100, 2000, 2) == []
    assert retry_delays_ms(8, 100, 2000, 2) == [100, 200, 400, 800, 1600, 2000, 2000]
    # 20 attempts, 100 ms x1.5 capped at 2 s: 26.9 s, which the real smg 1.13 took (26.75 s measured
    # with jitter off by chance of the draw: the fault suite checks this figure against smg itself).
    low, high = retry_window_s(20, 100, 2000, 1.5, 0.0)
    assert low == high and 26.9 < low < 27.0


def test_the_grace_sizes_attempts_at_the_jitters_low_end() -> None:
    attempts = retry_attempts_for(300, 100, 2000, 2.0, 0.2)
    assert retry_window_s(attempts, 100, 2000, 2.0, 0.2)[0] >= 300
    assert retry_window_s(attempts - 1, 100, 2000, 2.0, 0.2)[0] < 300
    assert attempts == 192
    assert retry_attempts_for(0.01, 100, 2000, 2.0, 0.0) == 2
    assert health_failure_threshold_for(300, 10) == 31  # 30 probes may all fail inside 300 s
    assert health_failure_threshold_for(5, 10) == 2


def test_router_argv_carries_the_derived_fault_settings() -> None:
    argv = router_argv(["smg", "launch"], {**BASE, **FAULTS})
    assert _value(argv, "--retry-max-retries") == "192"
    assert _value(argv, "--health-failure-threshold") == "31"
    assert _value(argv, "--health-success-threshold") == "1"
    assert (_value(argv, "--retry-initial-backoff-ms"), _value(argv, "--retry-max-backoff-ms")) == (
        "100",
        "2000",
    )
    assert (_value(argv, "--retry-backoff-multiplier"), _value(argv, "--retry-jitter-factor")) == (
        "2.0",
        "0.2",
    )
    assert "--disable-circuit-breaker" in argv and not any(a.startswith("--cb-") for a in argv)
    assert "--no-remove-unhealthy-workers" in argv
    assert _value(argv, "--pd-admission-wait-secs") == "30"
    explicit = router_argv(["smg"], {**BASE, **FAULTS, "retry_max_retries": 7, "health_failure_threshold": 3})
    assert (_value(explicit, "--retry-max-retries"), _value(explicit, "--health-failure-threshold")) == (
        "7",
        "3",
    )
    on = {"circuit_breaker": True, "cb_failure_threshold": 10, "cb_timeout_duration_secs": 15,
          "remove_unhealthy_workers": True}  # fmt: skip
    breaker = router_argv(["smg"], {**BASE, **FAULTS, **on})
    assert (
        "--disable-circuit-breaker" not in breaker and _value(breaker, "--cb-timeout-duration-secs") == "15"
    )
    assert "--remove-unhealthy-workers" in breaker


@pytest.mark.parametrize(
    ("change", "match"),
    [({"outage_grace_s": 0}, "outage_grace_s must be positive"),
     ({"retry_jitter_factor": 1.0}, "jitter_factor must be in"),
     ({"retry_max_backoff_ms": 50}, "max_backoff_ms=50 is below"),
     ({"retry_backoff_multiplier": 0.5}, "multiplier must be >= 1"),
     ({"retry_initial_backoff_ms": 0}, "initial_backoff_ms must be > 0"),
     ({"retry_max_backoff_ms": None}, "needs serving_router_retry_initial_backoff_ms")],
)  # fmt: skip
def test_bad_fault_settings_name_the_variable(change: dict, match: str) -> None:
    with pytest.raises(CommandError, match=match):
        router_argv(["smg"], {**BASE, **FAULTS, **change})


def test_smgs_own_parser_reads_the_retry_figures_that_cover_the_grace() -> None:
    """smg 1.13's parser (smg.launch_router.parse_router_args, what `smg launch` calls) gets the
    derived figures, and the retry window of what it parsed covers the 300 s grace."""
    from smg.launch_router import parse_router_args

    argv = router_argv(["smg", "launch"], {**BASE, **FAULTS})
    parsed = parse_router_args(argv[2:])
    assert (parsed.retry_max_retries, parsed.health_failure_threshold, parsed.health_check_interval_secs) == (
        192,
        31,
        10,
    )
    assert (parsed.retry_initial_backoff_ms, parsed.retry_max_backoff_ms) == (100, 2000)
    assert (parsed.retry_backoff_multiplier, parsed.retry_jitter_factor) == (2.0, 0.2)
    assert parsed.disable_circuit_breaker and parsed.remove_unhealthy_workers is False
    assert parsed.pd_admission_wait_secs == 30
    low, high = retry_window_s(
        parsed.retry_max_retries,
        parsed.retry_initial_backoff_ms,
        parsed.retry_max_backoff_ms,
        parsed.retry_backoff_multiplier,
        parsed.retry_jitter_factor,
    )
    assert low >= 300 and round(high) == 450, (low, high)  # README: "300 to 450 s"
    # The health threshold smg parsed outlasts the grace too: that many probes 10 s apart.
    assert (parsed.health_failure_threshold - 1) * parsed.health_check_interval_secs >= 300


def test_real_smg_takes_the_default_argv() -> None:
    """The pinned smg parses every rendered flag; a flag it lacks would end it with 'unrecognized'.

    A last --retry-max-retries 0 makes smg stop at its own config check, after parsing, before serving.
    """
    defaults = yaml.safe_load((ROOT / "roles/serving/defaults/main.yml").read_text())
    names = ["worker_outage_grace_s", "retry_initial_backoff_ms", "retry_max_backoff_ms",
             "retry_backoff_multiplier", "retry_jitter_factor", "health_success_threshold", "circuit_breaker",
             "remove_unhealthy_workers", "pd_admission_wait_secs", "health_check_timeout_secs",
             "worker_startup_check_interval_secs"]  # fmt: skip
    settings = {**BASE, **{name: defaults[f"serving_router_{name}"] for name in names}}
    settings["outage_grace_s"] = settings.pop("worker_outage_grace_s")
    settings["port"] = reserve_ports(1)[0]
    argv = router_argv([str(Path(sys.executable).parent / "smg"), "launch"], settings)
    stop = ["--retry-max-retries", "0"]
    parsed = subprocess.run([*argv, *stop], capture_output=True, text=True, timeout=60, check=False)
    assert "unrecognized arguments" not in parsed.stderr, parsed.stderr[-1500:]
    assert "retry.max_retries" in parsed.stdout + parsed.stderr
    bad = subprocess.run(
        [*argv, "--no-such-flag", *stop], capture_output=True, text=True, timeout=60, check=False
    )
    assert "unrecognized arguments: --no-such-flag" in bad.stderr


def test_real_smg_takes_the_regular_mode_argv_over_aggregated_instances() -> None:
    """smg 1.13's own parser (smg.launch_router.parse_router_args) reads the aggregated form: file
    discovery of the workers, regular mode (no PD flag) and every policy the serving role's spec allows."""
    from smg.launch_router import parse_router_args

    spec = yaml.safe_load((ROOT / "roles/serving/meta/argument_specs.yml").read_text())
    choices = spec["argument_specs"]["main"]["options"]["serving_router_aggregated_policy"]["choices"]
    defaults = yaml.safe_load((ROOT / "roles/serving/defaults/main.yml").read_text())
    assert defaults["serving_router_aggregated_policy"] == "cache_aware"
    workers = [{"url": "http://10.0.0.1:30000"}, {"url": "http://10.0.0.1:30001"}]
    for policy in choices:
        settings = {**BASE, **FAULTS, "prefill": [], "decode": [], "aggregated": workers}
        argv = router_argv(["smg", "launch"], {**settings, "aggregated_policy": policy})
        parsed = parse_router_args(argv[2:])
        assert parsed.worker_urls == [] and parsed.selected_discovery_provider() == "file"
        assert parsed.discovery_file == "/srv/pd/router-workers.json"
        assert not parsed.pd_disaggregation and parsed.policy == policy
