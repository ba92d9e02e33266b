"""The bootstrap rendezvous between a prefill-role and a decode-role simulator.

SGLang's decode worker learns from the request which prefill instance holds the KV cache
(bootstrap_host, bootstrap_port) and which transfer it belongs to (bootstrap_room), then waits
for it. The simulator keeps that contract with a line protocol on the prefill's bootstrap port:

    decode -> prefill:  WAIT <room>\\n
    prefill -> decode:  READY <room> <prompt_tokens>\\n   (once the prefill of that room finished)
                        TIMEOUT <room>\\n                  (no prefill for the room in time)
    anyone  -> prefill: PING\\n  ->  PONG pd-sim-worker\\n

A connection that sends nothing (smg's TCP reachability probe) is simply closed.

SGLang's PD timeouts and heartbeat are honoured where the simulation has the same moment
(SGLang 0.5.23, srt/environ.py defaults; srt/disaggregation/common/conn.py semantics):

- SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT (300 s): a prefilled room the decode never takes fails on
  the prefill side once this long has passed since the request arrived (CommonKVSender's
  _check_bootstrap_timeout); the prefill answers 500, as SGLang's handle_inflight_transfer_failure.
- SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300 s): how long the decode waits for its room
  (_check_waiting_timeout); the engine's --sim-rendezvous-timeout-s defaults to it.
- SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL (5 s, at least 2) and ..._HEARTBEAT_MAX_FAILURE (2, at
  least 1): while it waits, the decode asks the prefill's bootstrap port every interval (SGLang's
  heartbeat_checker GETs the bootstrap server's /health with a (2 s, 3 s) timeout); after that many
  misses in a row the room fails ("lost connection with prefill instance", _handle_node_failure).
  A broken wait connection alone fails nothing: SGLang learns of a dead prefill from the heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from pd_standins.engine import SIMULATOR_NAME
from pd_standins.engine.deadline import within

ROOM_TTL_S = 300.0
# SGLang's heartbeat GET uses timeout=(2, 3): 2 s to connect, 3 s to read.
HEARTBEAT_CONNECT_TIMEOUT_S = 2.0
HEARTBEAT_READ_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class PdTimeouts:
    """SGLang's PD deadline and heartbeat as the simulator applies them (defaults: SGLang 0.5.23).

    The decode's waiting timeout is the engine's rendezvous timeout (SimConfig.rendezvous_timeout_s).
    """

    bootstrap_timeout_s: float = 300.0
    heartbeat_interval_s: float = 5.0
    heartbeat_max_failure: int = 2

    def __post_init__(self) -> None:
        # SGLang's floors (common/conn.py): the interval is at least 2 s, the failures at least 1.
        object.__setattr__(self, "heartbeat_interval_s", max(float(self.heartbeat_interval_s), 2.0))
        object.__setattr__(self, "heartbeat_max_failure", max(int(self.heartbeat_max_failure), 1))


class RendezvousError(RuntimeError):
    """The decode side could not pair with a prefill for a room."""


@dataclass
class _Room:
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    taken: asyncio.Event = field(default_factory=asyncio.Event)
    prompt_tokens: int = 0
    created: float = field(default_factory=time.monotonic)


class BootstrapRooms:
    """Rooms a prefill-role simulator has finished (or is waited on)."""

    def __init__(self, wait_timeout_s: float) -> None:
        self.wait_timeout_s = wait_timeout_s
        # The prefill ranks' transfer ports (pd_standins.engine.transfer), registered at start-up.
        self.rank_endpoints: list[str] = []
        self._rooms: dict[int, _Room] = {}
        # Rooms a decode took, kept until the prefill that filled them has seen it (taken()).
        self._taken: dict[int, _Room] = {}

    def _room(self, room: int) -> _Room:
        self._expire()
        return self._rooms.setdefault(room, _Room())

    def _expire(self) -> None:
        now = time.monotonic()
        for rooms in (self._rooms, self._taken):
            for key in [k for k, r in rooms.items() if now - r.created > ROOM_TTL_S]:
                del rooms[key]

    def mark_ready(self, room: int, prompt_tokens: int) -> None:
        state = self._room(room)
        state.prompt_tokens = prompt_tokens
        state.ready.set()

    async def wait(self, room: int) -> int | None:
        state = self._room(room)
        try:
            await within(state.ready.wait(), self.wait_timeout_s)
        except asyncio.TimeoutError:
            return None
        self._rooms.pop(room, None)
        state.taken.set()
        self._taken[room] = state
        return state.prompt_tokens

    async def taken(self, room: int, timeout_s: float) -> bool:
        """Wait until a decode took `room` (the KV transfer is done); False after `timeout_s`.

        SGLang's prefill answers a request only once its KV reached the decode, and fails it
        after SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT when no decode ever bootstraps the room.
        """
        state = self._taken.pop(room, None) or self._rooms.get(room)
        if state is None:
            return False
        try:
            await within(state.taken.wait(), timeout_s)
        except asyncio.TimeoutError:
            self._rooms.pop(room, None)
            return False
        self._taken.pop(room, None)
        return True

    def __len__(self) -> int:
        return len(self._rooms)

    async def handle_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                words = line.decode("ascii", "replace").split()
                if words[:1] == ["PING"]:
                    writer.write(f"PONG {SIMULATOR_NAME}\n".encode())
                elif len(words) == 2 and words[0] == "WAIT" and words[1].lstrip("-").isdigit():
                    room = int(words[1])
                    tokens = await self.wait(room)
                    ranks = ",".join(self.rank_endpoints) or "-"
                    reply = f"TIMEOUT {room}" if tokens is None else f"READY {room} {tokens} {ranks}"
                    writer.write(f"{reply}\n".encode())
                else:
                    writer.write(b"ERROR expected WAIT <room> or PING\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def ping(host: str, port: int) -> bool:
    """One heartbeat: PING the bootstrap port, True on a PONG within SGLang's (2 s, 3 s) timeouts."""
    try:
        reader, writer = await within(asyncio.open_connection(host, port), HEARTBEAT_CONNECT_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        writer.write(b"PING\n")
        await writer.drain()
        line = await within(reader.readline(), HEARTBEAT_READ_TIMEOUT_S)
        return line.startswith(b"PONG")
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        writer.close()


async def _heartbeat(host: str, port: int, interval_s: float, max_failure: int) -> int:
    """Ping every `interval_s` until `max_failure` misses in a row; return the misses."""
    misses = 0
    while misses < max_failure:
        await asyncio.sleep(interval_s)
        misses = 0 if await ping(host, port) else misses + 1
    return misses


async def _wait_ready(reader: asyncio.StreamReader) -> list[str]:
    """The prefill's answer to WAIT; [] when the connection broke first (the answer never comes)."""
    try:
        line = await reader.readline()
    except OSError:
        line = b""
    words = line.decode("ascii", "replace").split()
    if not words:
        await asyncio.Event().wait()  # a broken connection says nothing; the heartbeat decides
    return words


async def rendezvous(
    host: str, port: int, room: int, timeout_s: float, timeouts: PdTimeouts | None = None
) -> tuple[int, list[str]]:
    """Wait at the prefill's bootstrap port until `room` is prefilled; return its prompt token count and
    the prefill ranks' transfer endpoints.

    `timeout_s` is the decode's waiting timeout; while it runs, a heartbeat watches the prefill.
    """
    timeouts = timeouts or PdTimeouts()
    try:
        reader, writer = await within(asyncio.open_connection(host, port), timeout_s)
    except (OSError, asyncio.TimeoutError) as exc:
        raise RendezvousError(f"cannot reach the prefill bootstrap server at {host}:{port}: {exc}") from exc
    answer = asyncio.ensure_future(_wait_ready(reader))
    heartbeat = asyncio.ensure_future(
        _heartbeat(host, port, timeouts.heartbeat_interval_s, timeouts.heartbeat_max_failure)
    )
    try:
        with contextlib.suppress(OSError):  # a prefill gone at once: the heartbeat will say so
            writer.write(f"WAIT {room}\n".encode())
            await writer.drain()
        done, _ = await asyncio.wait(
            {answer, heartbeat}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for task in (answer, heartbeat):
            task.cancel()
        writer.close()
    if answer in done:
        words = answer.result()
    elif heartbeat in done:
        raise RendezvousError(
            f"lost connection with prefill instance {host}:{port}: {heartbeat.result()} heartbeats "
            f"missed {timeouts.heartbeat_interval_s:g} s apart (bootstrap room {room})"
        )
    else:
        raise RendezvousError(
            f"bootstrap room {room} at {host}:{port}: timed out after {timeout_s:g} s waiting for the prefill"
        )
    if len(words) in (3, 4) and words[0] == "READY":
        endpoints = [e for e in (words[3] if len(words) == 4 else "").split(",") if e and e != "-"]
        return int(words[2]), endpoints
    raise RendezvousError(f"prefill at {host}:{port} answered {' '.join(words)!r} for bootstrap room {room}")
