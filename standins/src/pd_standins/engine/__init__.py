"""pd-sim-worker: the rehearsal engine.

A product feature, not a test double hidden in tests/: it speaks the subset of SGLang's worker
HTTP API that smg's PD mode and the validation stage use, so a whole deployment (supervisord,
smg, the serving role, the benchmark client) can be rehearsed on a machine without GPUs. It never
pretends to be SGLang: every response carries an ``X-PD-Simulator`` header and /server_info says
``"simulator": true``.
"""

from __future__ import annotations

from pd_standins import __version__

SIMULATOR_NAME = "pd-sim-worker"
SIMULATOR_HEADER = "X-PD-Simulator"
# What a profile trace of the rehearsal engine says wrote it (its `stand_in` key), so the day-2
# profile report names the stand-in instead of passing the trace off as GPU kernels.
TRACE_STAND_IN = f"{SIMULATOR_NAME}, the rehearsal engine (serving_engine_command, standins/declared.yml)"
SIMULATOR_BANNER = f"{SIMULATOR_NAME}/{__version__} (rehearsal engine; simulated output, not SGLang)"
