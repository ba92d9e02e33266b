"""Env hooks and supervisor quoting, checked against supervisor 4.3's own parsers."""

from __future__ import annotations

import shlex

import pytest
from supervisor.datatypes import dict_of_key_value_pairs
from supervisor.options import UnhosedConfigParser

from pd_appliance.serving.supervisor_format import (
    EnvHookError,
    env_file_lines,
    merge_env,
    supervisor_command,
    supervisor_environment,
)


def _parse_program(command: str, environment: str) -> tuple[list[str], dict[str, str]]:
    """What supervisord reads back: ini parsing, %-expansion, then its shlex splits."""
    parser = UnhosedConfigParser()
    parser.read_string(f"[program:x]\ncommand={command}\nenvironment={environment}\n")
    raw_command = parser.get("program:x", "command") % {}
    raw_env = parser.get("program:x", "environment") % {}
    return shlex.split(raw_command), dict_of_key_value_pairs(raw_env)


def test_merge_order_common_role_host_and_none_removes() -> None:
    merged = merge_env(
        {"A": "common", "B": "common", "DROP": "x"},
        {"B": "role", "FLAG": True},
        {"A": "host", "DROP": None, "N": 3},
    )
    assert merged == {"A": "host", "B": "role", "FLAG": "1", "N": "3"}


def test_bad_hook_names_are_refused() -> None:
    with pytest.raises(EnvHookError, match="not a valid environment variable name"):
        merge_env({"BAD-NAME": "x"})
    with pytest.raises(EnvHookError, match="must be a dict"):
        merge_env(["A=1"])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "value",
    [
        "cuda_ipc,cuda_copy,sm,self,tcp",
        "with spaces and, commas",
        '{"The capital of France is": " Paris."}',
        "it's",
        "100%",
        "%(ENV_HOME)s literal",
        "",
        "a=b=c",
        "tab\there",
    ],
)
def test_environment_round_trips_through_supervisor(value: str) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "V": value, "Z": "last"}
    _, parsed = _parse_program("/bin/true", supervisor_environment(env))
    assert parsed == env


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("both ' and \"", "both"),
        ('"quoted"', "starts or ends with a quote"),
        ("two\nlines", "spans lines"),
        ("cut ;here", "comment"),
        ("cut #here", "comment"),
    ],
)
def test_unrepresentable_values_fail_naming_the_fix(value: str, reason: str) -> None:
    with pytest.raises(EnvHookError, match=reason) as info:
        supervisor_environment({"V": value})
    assert "env file" in str(info.value)


def test_command_round_trips_through_supervisor_with_one_flag_per_line() -> None:
    argv = ["/opt/x/bin/python", "-m", "sglang.launch_server", "--model-path", "/srv/my model",
            "--ratio", "90%", "--json", '{"a": [1, 2]}', "--name", "it's"]  # fmt: skip
    rendered = supervisor_command(argv)
    assert "\n    --model-path" in rendered
    parsed, _ = _parse_program(rendered, 'A="1"')
    assert parsed == argv


def test_command_word_with_inline_comment_is_refused() -> None:
    with pytest.raises(EnvHookError, match="cut off"):
        supervisor_command(["/bin/echo", "a #b"])


def test_env_file_lines_are_verbatim_and_refuse_newlines() -> None:
    assert env_file_lines({"B": "x=y \"'", "A": True}) == "A=1\nB=x=y \"'\n"
    with pytest.raises(EnvHookError, match="spans lines"):
        env_file_lines({"A": "1\n2"})
