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
SIMULATOR_BANNER = f"{SIMULATOR_NAME}/{__version__} (rehearsal engine; simulated output, not SGLang)"
