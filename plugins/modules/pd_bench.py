#!/usr/bin/python
"""Ansible module pd_bench: probe and measure the served model through the router (pd_appliance.bench)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pd_bench
short_description: Correctness probe, then closed-loop streaming throughput at each concurrency
description:
  - Waits for the router's C(/readiness), greedy-decodes I(probe_prompt) and checks for I(probe_expect),
    then runs each level of I(concurrency) as a closed loop of streamed requests (fixed lengths,
    temperature 0, ignore_eos, prompts from the checked-in corpus) to a steady state, with a warm-up
    not counted, then waves of as many completed requests as the concurrency until at least
    I(num_requests) requests, I(min_waves) waves and I(min_measure_s) seconds are measured. Returns
    every figure (output tok/s with the per-wave figures and their spread, per-request decode tok/s,
    TTFT/TPOT/ITL p50/p90/p99, errors, wall time) as C(measurement).
  - While each level is measured it samples C(sglang:num_running_reqs) on every I(decode_metrics_urls)
    and records the peak number of requests the decode workers ran at once (C(decode_running)).
  - Never fails on what it measures (errors, timeouts, a wrong answer are figures for the gates);
    fails only on bad arguments. Changes nothing on the host (C(changed=false)); in check mode it
    measures nothing.
  - Needs pd_appliance (and aiohttp) in the interpreter; run it with the tools venv.
options:
  url:
    description: Base URL of the router.
    type: str
    required: true
  model:
    description: Model name; empty means the first of /v1/models.
    type: str
    default: ""
  api:
    description: OpenAI endpoint to measure.
    type: str
    choices: [completions, chat]
    default: completions
  concurrency:
    description: Concurrency levels.
    type: list
    elements: int
    default: [1, 16]
  num_requests:
    description: >-
      Measured requests per level (one value for all, or one per level): a lower bound, reached in
      whole waves.
    type: list
    elements: int
    default: [8, 64]
  min_measure_s:
    description: >-
      Seconds of steady-state waves each level measures at least; 0 leaves it to I(num_requests) and
      I(min_waves).
    type: float
    default: 0
  min_waves:
    description: >-
      Waves each level measures at least (a wave is as many completed requests as the concurrency);
      the spread (p10/p50/p90, CV) is over the waves' output tok/s.
    type: int
    default: 1
  thinking:
    description: The chat template's thinking mode for I(api=chat) (sent as chat_template_kwargs).
    type: bool
    default: false
  warmup_requests:
    description: Warm-up requests per level (one or one per level); empty means one per concurrency slot.
    type: list
    elements: int
    default: []
  input_len:
    description: Prompt length (tokens with a tokenizer, else characters).
    type: int
    default: 1024
  output_len:
    description: Output tokens per request (ignore_eos).
    type: int
    default: 256
  tokenizer:
    description: tokenizer.json for exact input token counts.
    type: path
  tokenizer_required:
    description: >-
      Fail when I(tokenizer) is given but its file or the C(tokenizers) library is missing; false falls
      back to measuring prompts in characters (the measurement says which).
    type: bool
    default: true
  decode_metrics_urls:
    description: Each decode worker's /metrics, sampled while each level is measured.
    type: list
    elements: str
    default: []
  metrics_interval_s:
    description: Seconds between two reads of I(decode_metrics_urls).
    type: float
    default: 1.0
  request_timeout_s:
    description: Seconds one request may take; beyond it counts as failed.
    type: float
    default: 600
  ready_timeout_s:
    description: Seconds to wait for /readiness first (0 = do not wait).
    type: float
    default: 0
  probe_prompt:
    description: Probe prompt.
    type: str
    default: The capital of France is
  probe_expect:
    description: Text the probe's answer must contain (case-insensitive).
    type: str
    default: Paris
  probe_api:
    description: Endpoint of the probe.
    type: str
    choices: [completions, chat]
    default: completions
  probe_max_tokens:
    description: Tokens the probe may generate.
    type: int
    default: 16
  probe_only:
    description: Wait for readiness and probe, measure nothing (after switching configuration).
    type: bool
    default: false
  kv_warmup:
    description:
      - >-
        Before measuring, send one untimed probe through the router (named C(kv-warmup)): the first prefill ->
        decode handoff pays UCX's cold start (NIXL connection setup), which no measured figure should carry.
        Its result is returned as C(kv_warmup); it gates nothing (the measurement's own probe decides).
    type: bool
    default: false
  variant:
    description: Name of the configuration being measured.
    type: str
    default: deployed
  api_key:
    description: Bearer key for the router (smg --api-key).
    type: str
    default: ""
    no_log: true
"""

EXAMPLES = r"""
- name: Measure through the router
  pd_bench:
    url: http://127.0.0.1:8000
    concurrency: [1, 16]
    num_requests: [8, 64]
    min_measure_s: 60
    min_waves: 5
  vars:
    ansible_python_interpreter: "{{ appliance_tools_python }}"
  register: validation_run
"""

RETURN = r"""
measurement:
  description: Probe result, readiness, workloads and one dict of figures per concurrency (C(phases)).
  returned: always
  type: dict
kv_warmup:
  description: The warm-up probe's measurement (C(probe), C(ready)), when I(kv_warmup) asked for one.
  returned: when kv_warmup
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible wants DOCUMENTATION first
from ansible.module_utils.pd_module import tools_venv  # noqa: E402

ARGUMENT_SPEC = {
    "url": {"type": "str", "required": True},
    "model": {"type": "str", "default": ""},
    "api": {"type": "str", "choices": ["completions", "chat"], "default": "completions"},
    "concurrency": {"type": "list", "elements": "int", "default": [1, 16]},
    "num_requests": {"type": "list", "elements": "int", "default": [8, 64]},
    "min_measure_s": {"type": "float", "default": 0.0},
    "min_waves": {"type": "int", "default": 1},
    "thinking": {"type": "bool", "default": False},
    "warmup_requests": {"type": "list", "elements": "int", "default": []},
    "input_len": {"type": "int", "default": 1024},
    "output_len": {"type": "int", "default": 256},
    "tokenizer": {"type": "path"},
    "tokenizer_required": {"type": "bool", "default": True},
    "decode_metrics_urls": {"type": "list", "elements": "str", "default": []},
    "metrics_interval_s": {"type": "float", "default": 1.0},
    "request_timeout_s": {"type": "float", "default": 600.0},
    "ready_timeout_s": {"type": "float", "default": 0.0},
    "probe_prompt": {"type": "str", "default": "The capital of France is"},
    "probe_expect": {"type": "str", "default": "Paris"},
    "probe_api": {"type": "str", "choices": ["completions", "chat"], "default": "completions"},
    "probe_max_tokens": {"type": "int", "default": 16},
    "probe_only": {"type": "bool", "default": False},
    "kv_warmup": {"type": "bool", "default": False},
    "variant": {"type": "str", "default": "deployed"},
    "api_key": {"type": "str", "default": "", "no_log": True},
}


def main() -> None:
    """Parse arguments, measure, exit."""
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    with tools_venv(
        module,
        "pd_appliance.bench is not importable by {python} ({err}): run pd_bench with the "
        "tools venv (ansible_python_interpreter: appliance_tools_python) after the appliance_tools role.",
    ):
        from pd_appliance.bench.runner import Plan, ProbeSpec, measure_sync, plan_from_lists
        from pd_appliance.bench.workload import WorkloadError
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: nothing measured", measurement={})
    probe = ProbeSpec(p["probe_prompt"], p["probe_expect"], p["probe_api"], p["probe_max_tokens"])
    try:
        if p["probe_only"] or p["kv_warmup"]:
            plan = Plan(
                p["url"], [], p["model"], p["api_key"], probe=probe, ready_timeout_s=p["ready_timeout_s"],
                variant="kv-warmup" if p["kv_warmup"] else p["variant"],
            )  # fmt: skip
            probed = measure_sync(plan)
            if p["probe_only"]:
                module.exit_json(changed=False, measurement=probed)
        warmup = {"kv_warmup": probed} if p["kv_warmup"] else {}
        plan = plan_from_lists(
            p["url"],
            p["concurrency"],
            p["num_requests"],
            p["input_len"],
            p["output_len"],
            p["warmup_requests"] or None,
            p["api"],
            p["request_timeout_s"],
            p["min_measure_s"],
            p["min_waves"],
            p["thinking"],
            model=p["model"],
            api_key=p["api_key"],
            tokenizer=p["tokenizer"],
            tokenizer_required=p["tokenizer_required"],
            probe=probe,
            ready_timeout_s=p["ready_timeout_s"],
            variant=p["variant"],
            decode_metrics_urls=p["decode_metrics_urls"],
            metrics_interval_s=p["metrics_interval_s"],
        )
        measurement = measure_sync(plan)
    except WorkloadError as err:
        module.fail_json(msg=f"pd_bench: {err}")
    module.exit_json(changed=False, measurement=measurement, **warmup)


if __name__ == "__main__":
    main()
