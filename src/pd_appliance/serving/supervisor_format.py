"""Env-hook merging and the exact quoting supervisor 4.3 needs.

supervisor expands `%(...)s` in `command=` and `environment=` (a literal % must be %%), splits
`command=` with shlex (POSIX rules), and splits `environment=` with a non-POSIX shlex that keeps
quotes and then strips every quote character from both ends of a value. So a value is wrapped in
double quotes, or single quotes when it contains a double quote; a value that contains both
kinds, starts or ends with a quote, or spans lines cannot be written there and is refused with
the fix (move it to the program's env file).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# configparser (as supervisor sets it up) ends a value at whitespace followed by ; or #.
_INLINE_COMMENT = re.compile(r"\s[;#]")


class EnvHookError(ValueError):
    """An env hook cannot be rendered; the message names the variable and the fix."""


def env_value(value: Any) -> str:
    """Ansible/YAML scalars as a process would see them: true -> "1", false -> "0"."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def merge_env(*layers: Mapping[str, Any] | None) -> dict[str, str]:
    """Merge env-hook dicts left to right (common -> role -> host); a None value removes the key."""
    merged: dict[str, str] = {}
    for depth, layer in enumerate(layers):
        if not layer:
            continue
        if not isinstance(layer, Mapping):
            raise EnvHookError(
                f"env hook layer {depth} must be a dict of NAME: value, got {type(layer).__name__}"
            )
        for name, value in layer.items():
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise EnvHookError(f"env hook name {name!r} is not a valid environment variable name")
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = env_value(value)
    return dict(sorted(merged.items()))


def supervisor_env_value(name: str, value: str) -> str:
    """One quoted value for `environment=`."""
    fix = f"set {name} in the program's env file instead (serving_env_file_vars), or change the value"
    if "\n" in value or "\r" in value:
        raise EnvHookError(f"environment value of {name} spans lines, which supervisor cannot hold: {fix}")
    if '"' in value and "'" in value:
        raise EnvHookError(
            f"environment value of {name} contains both ' and \", which supervisor cannot quote: {fix}"
        )
    if value and (value[0] in "'\"" or value[-1] in "'\""):
        raise EnvHookError(
            f"environment value of {name} starts or ends with a quote, which supervisor strips: {fix}"
        )
    if _INLINE_COMMENT.search(value):
        raise EnvHookError(
            f"environment value of {name} has ' ;' or ' #', which supervisor reads as a comment: {fix}"
        )
    quote = "'" if '"' in value else '"'
    return quote + value.replace("%", "%%") + quote


def supervisor_environment(env: Mapping[str, Any]) -> str:
    """The whole `environment=` value: KEY="v",KEY2='v "2"' (sorted, % escaped)."""
    parts = []
    for name, value in env.items():
        if not _ENV_NAME.match(str(name)):
            raise EnvHookError(f"environment variable name {name!r} is not valid")
        parts.append(f"{name}={supervisor_env_value(str(name), env_value(value))}")
    return ",".join(parts)


def supervisor_command(argv: Sequence[Any], continuation: str = " \\\n    ") -> str:
    """`command=` value: POSIX-quoted words, % escaped, one flag per continuation line for reading.

    Flags (words starting with --) begin a new indented line; supervisor's ini parser joins
    continuation lines with newlines, which shlex treats as spaces.
    """
    words = [str(a) for a in argv]
    if not words:
        raise EnvHookError("empty command line")
    out = shlex.quote(words[0])
    for word in words[1:]:
        sep = "\n    " if word.startswith("-") and continuation else " "
        out += sep + shlex.quote(word)
    if _INLINE_COMMENT.search(out):
        raise EnvHookError(
            f"command word with ' ;' or ' #' would be cut off by supervisor's config parser: {out!r}"
        )
    return out.replace("%", "%%")


def env_file_lines(env: Mapping[str, Any]) -> str:
    """KEY=value lines for the launcher's env file (value verbatim, one line each)."""
    lines = []
    for name, value in sorted(env.items()):
        text = env_value(value)
        if not _ENV_NAME.match(str(name)):
            raise EnvHookError(f"env file variable name {name!r} is not valid")
        if "\n" in text or "\r" in text:
            raise EnvHookError(
                f"env file value of {name} spans lines; the env file holds one line per variable"
            )
        lines.append(f"{name}={text}")
    return "".join(line + "\n" for line in lines)


def flatten(items: Iterable[Any]) -> list[str]:
    """Extra-flag lists may nest (['--flag', 'v'] or '--flag=v'); flatten to words."""
    words: list[str] = []
    for item in items or []:
        if isinstance(item, (list, tuple)):
            words.extend(flatten(item))
        elif item is not None:
            words.append(str(item))
    return words
