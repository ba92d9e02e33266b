"""Ask the real SGLang (in another Python, the parser venv's) through `introspect`.

introspect.py is run by path with `python -I`: the parser venv needs neither pd_appliance nor
this checkout on its sys.path, and nothing of the caller's environment leaks into its imports.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_appliance.sglang_args import introspect

_RUN = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


class RealSGLangError(RuntimeError):
    """The parser venv's Python could not answer."""


@dataclass(frozen=True)
class Verdict:
    """SGLang's answer to one argv: accepted, or refused with argparse's exit status and message."""

    argv: list[str]
    ok: bool
    exit_code: int | None
    message: str
    values: dict[str, Any]


@dataclass(frozen=True)
class RealSGLang:
    """The SGLang installed for `python` (e.g. a parser venv's bin/python)."""

    python: Path
    timeout_s: float = 300.0

    def _ask(self, op: str, request: Any = None) -> Any:
        with tempfile.TemporaryDirectory(prefix="pd-sglang-") as tmp:
            out = Path(tmp) / "answer.json"
            result = subprocess.run(
                [str(self.python), "-I", "-c", _RUN, introspect.__file__, op, str(out)],
                input=json.dumps(request or {}), capture_output=True, text=True,
                cwd=tmp, timeout=self.timeout_s, check=False,
            )  # fmt: skip
            if result.returncode != 0 or not out.is_file():
                raise RealSGLangError(
                    f"{self.python} could not answer {op!r} (exit {result.returncode}):\n"
                    + result.stderr[-4000:]
                )
            return json.loads(out.read_text())

    def parse(self, argvs: Sequence[Sequence[str]], fields: Sequence[str] = ()) -> list[Verdict]:
        """Each argv through sglang.srt.server_args.prepare_server_args, in one process; with the
        values SGLang parsed for `fields` (ServerArgs attribute names) where it accepted one."""
        answers = self._ask("parse", {"argvs": [list(a) for a in argvs], "fields": list(fields)})
        return [Verdict(argv=list(a), **answer) for a, answer in zip(argvs, answers, strict=True)]

    def resolve(
        self, argvs: Sequence[Sequence[str]], gpu: dict[str, Any], env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """SGLang's model-config and quant-method resolution for each argv (one process, one
        environment: SGLang reads some SGLANG_* variables once at import), on the GPU `gpu`
        ({capability, memory_mib, count, name, cuda}); see introspect.resolve_one."""
        request = {"argvs": [list(a) for a in argvs], "gpu": gpu, "env": dict(env or {})}
        answer: dict[str, Any] = self._ask("resolve", request)
        return answer

    def flag_table(self) -> dict[str, Any]:
        answer: dict[str, Any] = self._ask("flags")
        return answer

    def environ_names(self) -> dict[str, Any]:
        answer: dict[str, Any] = self._ask("environ-names")
        return answer
