"""The tuner in rehearsal: real supervisord, smg and rehearsal engine, driven by the real roles.

serve.yml deploys the lab layout; validate.yml with validation_tune runs a declared search
(validation_tune_search): stage "decode" measures three candidates over the deployed configuration
and keeps the best; stage "speculation" measures MTP over it (composed: decode-fast+mtp-on-slow).
The candidates' speeds differ through the rehearsal engine's per-token time (its PD_SIM_TPOT_MS env
hook):

- decode-fast: decode at 5 ms/token (an env hook: only pd:decode restarts);
- mtp-nextn: MTP spelt NEXTN (launch flags through serving_*_extra_args), as many DeepSeek guides
  spell it: SGLang's parser accepts it, DeepSeek-V4 refuses it at start (apply_deepseek_v4_defaults
  checks the algorithm before NEXTN is aliased to EAGLE; pd_standins.engine.model_checks), so both
  workers crash-loop. The tuner rules it out with their log tails, puts decode-fast (what served
  before it) back, re-verifies it and goes on; the release record is not marked failed;
- mtp-on-slow: speculative decoding on (off as shipped; a launch flag: prefill and decode restart) at
  14 ms: over decode-fast, its env hook wins (decode at 14 ms);
- decode-capped: the fastest per token (2 ms) but --max-running-requests 6 (serving_max_running_requests),
  so the decode worker never runs 16 requests at once: its C=16 figure is not a C=16 figure, and
  the decode-concurrency check (sglang:num_running_reqs on decode's /metrics) rules it out.

The tuner adopts decode-fast, records it on the host, and a later plain serve run keeps it: the same
rendered programs, nothing restarted. Then the deployment is served with --max-running-requests 6
(serving_max_running_requests, as a KV pool too small for 16 sequences would cap it): validation
fails, saying decode never ran 16 requests at once. Prompts are measured in tokens of the rehearsal
checkpoint's tokenizer, which the engine counts with too.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from pd_appliance.bench.workload import load_tokenizer, synthetic_prompt
from pd_standins.hub import generate
from pd_testlib import reserve_ports, run_playbook

pytestmark = pytest.mark.slow

# SGLang 0.5.23's words (sglang/srt/arg_groups/deepseek_v4_hook.py, apply_deepseek_v4_defaults).
NEXTN_REFUSAL = "Only EAGLE and DSPARK speculative algorithms are supported for DeepseekV4ForCausalLM"

BIN = Path(sys.executable).parent
CANDIDATES = [
    {"name": "decode-fast", "description": "decode at 5 ms/token",
     "env_hooks": {"decode": {"PD_SIM_TPOT_MS": "5"}}},
    {"name": "mtp-nextn", "description": "MTP spelt NEXTN: DeepSeek-V4 refuses it at start",
     "vars": {"serving_prefill_extra_args": ["--speculative-algorithm", "NEXTN"],
              "serving_decode_extra_args": ["--speculative-algorithm", "NEXTN"]}},
    {"name": "mtp-on-slow", "description": "speculative decoding on, decode at 14 ms/token",
     "vars": {"serving_speculative_algorithm": "EAGLE"}, "env_hooks": {"decode": {"PD_SIM_TPOT_MS": "14"}}},
    {"name": "decode-capped", "description": "2 ms/token, at most 6 running requests",
     "vars": {"serving_max_running_requests": 6}, "env_hooks": {"decode": {"PD_SIM_TPOT_MS": "2"}}},
]  # fmt: skip
SEARCH = [
    {"name": "decode", "variants": ["decode-fast", "mtp-nextn", "decode-capped"], "keep": 1},
    {"name": "speculation", "variants": ["mtp-on-slow"]},
]
COMPOSED = "decode-fast+mtp-on-slow"


def uptimes(config: Path) -> dict[str, str]:
    status = subprocess.run(
        [str(BIN / "supervisorctl"), "-c", str(config), "status"], capture_output=True, text=True, check=False
    ).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r"^(pd:\w+)\s+RUNNING\s+pid (\d+)", status, re.M)}


def test_tuner_adopts_the_fastest_eligible_variant_and_serve_keeps_it(
    tmp_path: Path, rehearsal_inventory_copy: Path
) -> None:
    prefill, decode, bootstrap, router, metrics = reserve_ports(5)
    venv = str(BIN.parent)
    # supervisord's unix socket path must stay under ~108 bytes: pytest's tmp_path is too deep.
    run_dir = tempfile.mkdtemp(prefix="pdv-", dir="/tmp")
    common = {
        "serving_supervisor_run_dir": run_dir,
        "appliance_tools_venv": venv,
        "appliance_router_venv": venv,
        "serving_prefill_port": prefill,
        "serving_decode_port": decode,
        "serving_bootstrap_port": bootstrap,
        "serving_router_port": router,
        "serving_router_metrics_port": metrics,
        # A known router key (the lab generates one), for the direct request at the end.
        "serving_router_api_key": "tuner-test-key",
    }
    root = rehearsal_inventory_copy.parent.parent / ".rehearsal" / "root"
    # What the checkpoint stage leaves on the host: the Hub stand-in's checkpoint, tokenizer included, in
    # the directory of the revision served (checkpoint_revision "main", not resolved by this test).
    model_dir = root / "srv" / "models" / "DeepSeek-V4-Flash-NVFP4" / "main"
    generate(model_dir)
    config = root / "etc" / "pd-appliance" / "supervisor" / "supervisord.conf"
    conf_d = config.parent / "conf.d"
    # The host state (ansible_local.pd_appliance): the tuner records the variant it adopts there.
    fact = root / "etc" / "ansible" / "facts.d" / "pd_appliance.fact"

    def adopted_variant() -> dict | None:
        return json.loads(fact.read_text()).get("variant") if fact.exists() else None

    try:
        served = run_playbook("playbooks/serve.yml", rehearsal_inventory_copy, "-e", json.dumps(common))
        assert served.returncode == 0, served.stdout[-3000:]
        before = uptimes(config)
        assert set(before) == {"pd:prefill", "pd:decode", "pd:router"}
        assert adopted_variant() is None

        extra = common | {
            "validation_tune": True,
            "validation_variants": CANDIDATES,
            "validation_tune_search": SEARCH,
            "validation_artifacts_dir": str(tmp_path / "artifacts"),
            "validation_num_requests": [4, 32],
            "validation_output_len": 64,
            "validation_decode_metrics_interval_s": 0.2,
        }
        validated = run_playbook(
            "playbooks/validate.yml", rehearsal_inventory_copy, "-e", json.dumps(extra), timeout=1500
        )
        assert validated.returncode == 0, validated.stdout[-4000:]
        report = json.loads((tmp_path / "artifacts" / "report.json").read_text())
        assert report["passed"] and report["selected_variant"] == "decode-fast"
        measured = ["deployed", "decode-fast", "mtp-nextn", "decode-capped", COMPOSED]
        assert [v["variant"] for v in report["variants"]] == measured
        assert [(s["stage"], s["kept"]) for s in report["search"]["stages"]] == [
            ("decode", ["decode-fast"]), ("speculation", ["decode-fast"])
        ]  # fmt: skip
        skipped = {s["variant"]: s["reason"] for s in report["search"]["skipped"]}
        # Stage speculation builds only on what stage decode kept; each base it dropped is named.
        assert skipped == {
            f"{base}+{{mtp-on-slow}}": f"{base} was not among the best 1 of stage decode"
            for base in ("deployed", "mtp-nextn", "decode-capped")
        }
        assert all(v["input_len_unit"] == "tokens" for v in report["variants"] if v["phases"])
        c16 = {
            v["variant"]: next(p for p in v["phases"] if p["concurrency"] == 16)
            for v in report["variants"]
            if v["phases"]
        }
        tok_s = {name: phase["output_tok_s"] for name, phase in c16.items()}
        assert tok_s["decode-fast"] > tok_s["deployed"] > tok_s[COMPOSED]
        peaks = {name: phase["decode_running"]["peak"] for name, phase in c16.items()}
        assert peaks["decode-capped"] == 6 and peaks["decode-fast"] == 16
        ranking = {r["variant"]: r for r in report["selection"]["ranking"]}
        assert report["selection"]["fastest"] == "decode-fast"
        assert ranking["decode-capped"]["eligible"] is False
        assert any("decode ran at most 6 requests at once" in r for r in ranking["decode-capped"]["reasons"])
        probes = {v["variant"]: v["probe"]["passed"] for v in report["variants"]}
        assert ranking["deployed"]["eligible"] and probes[COMPOSED] and probes["decode-fast"]
        # The candidate that never came up: ruled out with its programs' log tails (SGLang's own
        # AssertionError), what served before it put back and re-verified, the next one measured.
        nextn = next(v for v in report["variants"] if v["variant"] == "mtp-nextn")
        refusal = f"AssertionError: {NEXTN_REFUSAL}"
        assert not nextn["probe"]["passed"] and nextn["phases"] == []
        assert "did not come up" in nextn["probe"]["error"]
        crashed = r"pd:prefill on localhost did not become healthy: supervisor reports (BACKOFF|FATAL|EXITED)"
        assert re.search(crashed, nextn["probe"]["error"])
        assert "\n" not in nextn["probe"]["error"]  # one line a host; the log tails are under ruled_out
        out = nextn["ruled_out"]
        assert (
            out["put_back"] == "decode-fast"
            and out["put_back_probe"]["passed"]
            and not out["put_back_errors"]
        )
        blamed = {p["program"]: p for p in out["programs"]}
        assert "pd:prefill" in blamed and "pd:router" not in blamed
        assert refusal in blamed["pd:prefill"]["log_tail"]
        assert ranking["mtp-nextn"]["eligible"] is False
        assert c16[COMPOSED]["requests"] == 32
        put_back = " ".join(validated.stdout.split())
        assert "Candidate mtp-nextn ruled out, it did not come up" in put_back
        assert "Put back decode-fast: re-verified" in put_back
        releases = json.loads((root / "var" / "lib" / "pd-appliance" / "releases" / "state.json").read_text())
        assert [i["status"] for i in releases["releases"].values()].count("failed") == 0
        assert report["final_probe"]["passed"] is True
        markdown = (tmp_path / "artifacts" / "report.md").read_text()
        assert "## Variants side by side" in markdown and "6 of 16" in markdown
        assert f"| speculation | {COMPOSED} | decode-fast (best 1) |" in markdown
        assert "## Candidates ruled out (never came up)" in markdown and refusal in markdown
        assert (tmp_path / "artifacts" / "report.png").stat().st_size > 0

        adopted = adopted_variant()
        assert adopted is not None
        assert adopted["name"] == "decode-fast" and adopted["env_hooks"] == {
            "decode": {"PD_SIM_TPOT_MS": "5"}
        }
        assert adopted["vars"] == {} and "C=16 output tok/s" in adopted["objective"]
        after = uptimes(config)
        assert after["pd:router"] == before["pd:router"]  # no candidate touched the router
        decode_conf = (conf_d / "decode.conf").read_text()
        assert 'PD_SIM_TPOT_MS="5"' in decode_conf and "--max-running-requests" not in decode_conf
        assert "NEXTN" not in decode_conf and "NEXTN" not in (conf_d / "prefill.conf").read_text()
        assert "--speculative-algorithm" not in decode_conf  # MTP off as shipped; decode-fast keeps it off

        # A later plain serve run applies the adopted variant: the same programs, nothing restarts.
        again = run_playbook("playbooks/serve.yml", rehearsal_inventory_copy, "-e", json.dumps(common))
        assert again.returncode == 0, again.stdout[-3000:]
        assert "serves the adopted variant 'decode-fast'" in " ".join(again.stdout.split()).replace("''", "'")
        assert uptimes(config) == after
        assert (conf_d / "decode.conf").read_text() == decode_conf

        # A budget no candidate fits (validation_tune_budget_s): the search measures none, names each
        # with the reason, and what runs stays running untouched. Its figures are gated by the floors
        # only (the other gates are tests/validation's): the regression gate would compare with
        # decode-fast's figures from the tuning run, which CI's two busy workers put 15 % apart, and
        # at decode-fast's speed a C=16 wave lasts ~0.4 s, shorter than the default 1 s between two
        # reads of decode's /metrics, so the running-requests peak can fall between them.
        budget = common | {
            "validation_tune": True, "validation_variants": CANDIDATES, "validation_tune_search": SEARCH,
            "validation_tune_budget_s": 1, "validation_artifacts_dir": str(tmp_path / "budget"),
            "validation_output_len": 64, "validation_regression_tolerance": None,
            "validation_check_decode_concurrency": False,
        }  # fmt: skip
        spent = run_playbook("playbooks/validate.yml", rehearsal_inventory_copy, "-e", json.dumps(budget))
        assert spent.returncode == 0, spent.stdout[-3000:]
        budget_report = json.loads((tmp_path / "budget" / "report.json").read_text())
        assert [v["variant"] for v in budget_report["variants"]] == ["deployed"]
        reasons = {s["variant"]: s["reason"] for s in budget_report["search"]["skipped"]}
        assert set(reasons) == {"decode-fast", "mtp-nextn", "decode-capped", "mtp-on-slow"}
        assert all(
            r.startswith("validation_tune_budget_s: ") and "of 1 s spent" in r for r in reasons.values()
        )
        assert uptimes(config) == after

        # A decode capped below 16 running requests fails validation, saying so (the adopted variant stays).
        capped = common | {"serving_max_running_requests": 6}
        assert (
            run_playbook("playbooks/serve.yml", rehearsal_inventory_copy, "-e", json.dumps(capped)).returncode
            == 0
        )
        gate_run = capped | {
            "validation_artifacts_dir": str(tmp_path / "capped"),
            "validation_output_len": 64,
            # The gate is what this checks; putting a release back is tests/releases' (this deployment
            # has no SGLang venv of an earlier release to put back).
            "release_rollback_on_failure": False,
        }
        failed = run_playbook("playbooks/validate.yml", rehearsal_inventory_copy, "-e", json.dumps(gate_run))
        assert failed.returncode != 0
        assert "C=16: decode ran at most 6 requests at once" in " ".join(failed.stdout.split()), (
            failed.stdout[-3000:]
        )
        capped_report = json.loads((tmp_path / "capped" / "report.json").read_text())
        assert not capped_report["passed"]
        assert {g["name"] for g in capped_report["gates"] if not g["passed"]} >= {"C=16 decode concurrency"}

        # Token-exact: 100 tokens of the checkpoint's tokenizer are 100 prompt tokens to the engine.
        tokenizer = load_tokenizer(str(model_dir / "tokenizer.json"))
        prompt = synthetic_prompt(0, 100, tokenizer)
        body = {"model": "dsv4-flash", "prompt": prompt, "max_tokens": 4, "ignore_eos": True}
        request = urllib.request.Request(
            f"http://127.0.0.1:{router}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer tuner-test-key"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            usage = json.loads(response.read())["usage"]
        assert usage["prompt_tokens"] == 100 and usage["completion_tokens"] == 4
    finally:
        if config.exists():
            subprocess.run(
                [str(BIN / "supervisorctl"), "-c", str(config), "shutdown"], check=False, timeout=60
            )
        shutil.rmtree(run_dir, ignore_errors=True)
