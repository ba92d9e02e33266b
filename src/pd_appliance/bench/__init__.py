"""Serving benchmark for the appliance: a streaming client, its metrics, gates and report.

The figures follow sglang.benchmark.serving (bench_serving) so that a number from `pd-bench`
means the same as the number people quote from SGLang: output throughput is generated tokens
over the wall time of the measured phase, TTFT is the time to the first content chunk, TPOT is
(latency - TTFT) / (output tokens - 1) per request, ITL are the gaps between content chunks.
"""

from __future__ import annotations

SCHEMA_VERSION = 1
