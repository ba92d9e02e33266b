"""Helpers for the validation play tests: the OpenAI test double in a process, the play's -e vars."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOUBLE = ROOT / "tests" / "bench" / "openai_stream_double.py"


class DoubleProcess:
    """The OpenAI streaming test double in its own process (the play's modules are other processes)."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(DOUBLE), "--port", "0", *args], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def rehearsal_tokenizer(tmp_path: Path) -> Path:
    """The rehearsal checkpoint's tokenizer.json (built by the Hub stand-in), written under tmp_path."""
    from pd_standins.hub import rehearsal_tokenizer_json

    path = tmp_path / "tokenizer" / "tokenizer.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(rehearsal_tokenizer_json())
    return path


def validation_extra_vars(tmp_path: Path, url: str, **overrides: object) -> list[str]:
    """-e arguments: the checkout's venv as tools python, a small workload in tokens of the rehearsal
    tokenizer, the double's /metrics as the decode worker's, artifacts under tmp_path."""
    values: dict[str, object] = {
        "validation_router_url": url,
        "appliance_tools_venv": str(Path(sys.executable).parent.parent),
        "appliance_router_venv": str(Path(sys.executable).parent.parent),
        "validation_artifacts_dir": str(tmp_path / "artifacts"),
        "validation_concurrency": [1, 16],
        "validation_num_requests": [4, 32],
        "validation_input_len": 64,
        "validation_output_len": 16,
        "validation_ready_timeout_s": 10,
        "validation_request_timeout_s": 5,
        "validation_min_output_tok_s_bs1": 1.0,
        "validation_min_output_tok_s_c16": 1.0,
        "validation_tokenizer": str(rehearsal_tokenizer(tmp_path)),
        "validation_decode_metrics_urls": [f"{url}/metrics"],
        "validation_decode_metrics_interval_s": 0.2,
    }
    values.update(overrides)
    return ["-e", json.dumps(values)]
