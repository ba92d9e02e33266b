"""Record the GPU exporter's NVML calls on a real GPU, and replay them here.

RecordingNvml wraps pynvml: every call the exporter makes is passed to the real library and its
answer (or NVML error code) is written down, with GPU handles and event sets replaced by their GPU
index. ReplayNvml answers the same calls from that record, so a test runs the exporter on exactly
what NVML said on the H200, and the replayed scrape can be compared with the one taken there.
"""

from __future__ import annotations

import ctypes
import json
from collections import defaultdict, deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


class NVMLError(Exception):
    """pynvml's error, as the replay raises it: `value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(f"NVML error {value}")


class _Handle:
    def __init__(self, gpu: int, real: Any) -> None:
        self.gpu, self.real = gpu, real


class _EventSet:
    def __init__(self, number: int, real: Any) -> None:
        self.number, self.real = number, real


def _plain(value: Any) -> Any:
    """An NVML answer as JSON: ctypes structures become dicts of their fields (pointers left out)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, ctypes.Structure):
        out = {}
        for field in value._fields_:
            name, kind = field[0], field[1]
            if issubclass(kind, ctypes._Pointer) or kind is ctypes.c_void_p or name == "device":
                continue
            out[name] = _plain(getattr(value, name))
        return {"struct": out}
    if isinstance(value, ctypes.Array):
        return [_plain(v) for v in value]
    return value


def _key(args: list[Any]) -> str:
    return json.dumps(args, sort_keys=True)


class RecordingNvml:
    """A pynvml stand-in that forwards to the real module and logs each call and answer."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.NVMLError = real.NVMLError
        self.calls: list[dict[str, Any]] = []
        self._sets = 0

    def _arg(self, arg: Any) -> tuple[Any, Any]:
        if isinstance(arg, _Handle):
            return arg.real, {"gpu": arg.gpu}
        if isinstance(arg, _EventSet):
            return arg.real, {"event_set": arg.number}
        return arg, arg

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._real, name)

        def recorded(*args: Any) -> Any:
            real_args, logged = zip(*(self._arg(a) for a in args), strict=True) if args else ((), ())
            entry: dict[str, Any] = {"call": name, "args": list(logged)}
            self.calls.append(entry)
            try:
                answer = call(*real_args)
            except self._real.NVMLError as err:
                entry["error"] = err.value
                raise
            if name == "nvmlDeviceGetHandleByIndex":
                entry["value"] = {"handle": args[0]}
                return _Handle(args[0], answer)
            if name == "nvmlEventSetCreate":
                self._sets += 1
                entry["value"] = {"event_set": self._sets}
                return _EventSet(self._sets, answer)
            entry["value"] = _plain(answer)
            return answer

        return recorded


class ReplayNvml:
    """Answers the recorded calls in their recorded order (per call and arguments)."""

    NVMLError = NVMLError

    def __init__(self, calls: list[dict[str, Any]], simulated: bool = False) -> None:
        self.STAND_IN = "simulated GPUs (a test's replay)" if simulated else ""
        self._answers: dict[tuple[str, str], deque[dict[str, Any]]] = defaultdict(deque)
        for entry in calls:
            self._answers[(entry["call"], _key(entry["args"]))].append(entry)
        self.unanswered: list[tuple[str, str]] = []

    @classmethod
    def from_fixture(cls, name: str) -> tuple[ReplayNvml, dict[str, Any]]:
        record = json.loads((FIXTURES / name).read_text())
        return cls(record["calls"]), record

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("nvml"):
            raise AttributeError(name)

        def replay(*args: Any) -> Any:
            logged = [
                {"gpu": a.gpu}
                if isinstance(a, _Handle)
                else {"event_set": a.number}
                if isinstance(a, _EventSet)
                else a
                for a in args
            ]
            queue = self._answers.get((name, _key(logged)))
            if not queue:
                self.unanswered.append((name, _key(logged)))
                raise AssertionError(f"the record has no answer for {name}{tuple(logged)}")
            entry = queue.popleft() if len(queue) > 1 else queue[0]
            if "error" in entry:
                raise NVMLError(entry["error"])
            value = entry.get("value")
            if name == "nvmlDeviceGetHandleByIndex":
                return _Handle(value["handle"], None)
            if name == "nvmlEventSetCreate":
                return _EventSet(value["event_set"], None)
            if isinstance(value, dict) and "struct" in value:
                return SimpleNamespace(**value["struct"])
            return value

        return replay
