"""The rehearsal engine's command line: SGLang's flags from the derived table, refused like SGLang.

These run against the committed flag table (no wheel needed); tests/sglang/test_server_args.py
regenerates the table from the real parser and checks the engine against SGLang on a corpus.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import pytest

from pd_standins.engine import cli

BASE = ["--model-path", "/m"]


def _refusal(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        cli.config_from_args(argv)
    return int(exc.value.code or 0), err.getvalue().strip().splitlines()[-1]


def test_a_misspelt_flag_stops_the_engine_process_with_status_2_naming_it() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pd_standins.engine.cli", *BASE, "--port", "1", "--enable-metircs"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert (
        result.stderr.strip().splitlines()[-1]
        == "pd-sim-worker: error: unrecognized arguments: --enable-metircs"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--disaggregation-mode", "both"], "argument --disaggregation-mode: invalid choice: 'both'"),
        (["--tp-size"], "argument --tp-size/--tensor-parallel-size: expected one argument"),
        (["--tp-size", "four"], "argument --tp-size/--tensor-parallel-size: invalid int value: 'four'"),
        (["--kv-cache-dtype", "fp9"], "argument --kv-cache-dtype: invalid choice: 'fp9'"),
        (["--enable-metric"], "ambiguous option: --enable-metric could match --enable-metrics,"),
        (["--cuda-graph-bs-decode"], "argument --cuda-graph-bs-decode: expected at least one argument"),
        (["--default-chat-template-kwargs", "{"], "argument --default-chat-template-kwargs: not valid JSON"),
        (["--sim-ttft", "5"], "unrecognized arguments: --sim-ttft 5"),
    ],
)
def test_refused_like_sglangs_parser(argv: list[str], message: str) -> None:
    status, last = _refusal(BASE + argv)
    assert status == 2 and last.startswith(f"pd-sim-worker: error: {message}"), last


def test_model_path_is_required_as_in_sglang() -> None:
    assert _refusal(["--port", "1"]) == (
        2,
        "pd-sim-worker: error: the following arguments are required: --model-path/--model",
    )


def test_honoured_flags_are_read_and_the_rest_accepted_and_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PD_SIM_TPOT_MS", "3")
    config, ignored = cli.config_from_args(
        ["--model=/m", "--tensor-parallel-size", "4", "--disaggregation-mode", "prefill", "--port=31000",
         "--disaggregation-bootstrap", "9000", "--context-length", "32Ki", "--enable-metrics",
         "--cuda-graph-bs-decode", "1", "2", "--no-enable-tf32-matmul", "--disable-cuda-graph",
         "--sim-ttft-ms", "7", "--kv-cache-dtype", "fp8_e4m3"]
    )  # fmt: skip
    assert (config.model_path, config.tp_size, config.role, config.port) == ("/m", 4, "prefill", 31000)
    assert config.bootstrap_port == 9000 and config.context_length == 32768 and config.enable_metrics
    assert config.ttft_s == pytest.approx(0.007) and config.tpot_s == pytest.approx(0.003)
    assert config.launch_args.cuda_graph_bs_decode == [1, 2] and config.launch_args.disable_cuda_graph
    assert ignored == ["--no-enable-tf32-matmul", "--kv-cache-dtype", "fp8_e4m3"]


def test_defaults_when_only_the_model_is_given() -> None:
    config, ignored = cli.config_from_args(BASE)
    assert (config.host, config.port, config.bootstrap_port, config.role, config.tp_size) == (
        "127.0.0.1", 30000, 8998, "null", 1)  # fmt: skip
    assert not config.enable_metrics and ignored == []


def test_the_table_describes_every_flag_the_engine_reads_and_every_type_it_converts() -> None:
    table = cli.load_flag_table()
    dests = {f["dest"] for f in table["flags"]}
    assert set(cli.HONOURED) <= dests
    types = {f["type"] for f in table["flags"]} - {None}
    assert types <= set(cli.TYPES), f"add a converter for {types - set(cli.TYPES)} to cli.TYPES"
    options = [o for f in table["flags"] for o in f["options"]]
    assert len(options) == len(set(options))
    assert not [o for o in options if o.startswith("--sim")], (
        "an SGLang flag would collide with --sim-* knobs"
    )


@pytest.mark.parametrize(
    ("raw", "value"), [("4096", 4096), ("128k", 128000), ("25.6k", 25600), ("1Ki", 1024), ("2Mi", 2 * 2**20)]
)
def test_human_readable_int_reads_sglangs_suffixes(raw: str, value: int) -> None:
    assert cli.human_readable_int(raw) == value


def test_help_shows_the_flags_read_and_the_knobs() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
        cli.config_from_args(["--help"])
    assert exc.value.code == 0
    text = out.getvalue()
    assert "--model-path" in text and "--sim-ttft-ms" in text and "--kv-cache-dtype" not in text
