"""The bootstrap rendezvous between a prefill-role and a decode-role simulator.

SGLang's decode worker learns from the request which prefill instance holds the KV cache
(bootstrap_host, bootstrap_port) and which transfer it belongs to (bootstrap_room), then waits
for it. The simulator keeps that contract with a line protocol on the prefill's bootstrap port:

    decode -> prefill:  WAIT <room>\\n
    prefill -> decode:  READY <room> <prompt_tokens>\\n   (once the prefill of that room finished)
                        TIMEOUT <room>\\n                  (no prefill for the room in time)
    anyone  -> prefill: PING\\n  ->  PONG pd-sim-worker\\n

A connection that sends nothing (smg's TCP reachability probe) is simply closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from pd_standins.engine import SIMULATOR_NAME

ROOM_TTL_S = 300.0


class RendezvousError(RuntimeError):
    """The decode side could not pair with a prefill for a room."""


@dataclass
class _Room:
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    prompt_tokens: int = 0
    created: float = field(default_factory=time.monotonic)


class BootstrapRooms:
    """Rooms a prefill-role simulator has finished (or is waited on)."""

    def __init__(self, wait_timeout_s: float) -> None:
        self.wait_timeout_s = wait_timeout_s
        self._rooms: dict[int, _Room] = {}

    def _room(self, room: int) -> _Room:
        self._expire()
        return self._rooms.setdefault(room, _Room())

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [k for k, r in self._rooms.items() if now - r.created > ROOM_TTL_S]:
            del self._rooms[key]

    def mark_ready(self, room: int, prompt_tokens: int) -> None:
        state = self._room(room)
        state.prompt_tokens = prompt_tokens
        state.ready.set()

    async def wait(self, room: int) -> int | None:
        state = self._room(room)
        try:
            await asyncio.wait_for(state.ready.wait(), self.wait_timeout_s)
        except asyncio.TimeoutError:
            return None
        self._rooms.pop(room, None)
        return state.prompt_tokens

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
                    reply = f"TIMEOUT {room}" if tokens is None else f"READY {room} {tokens}"
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


async def rendezvous(host: str, port: int, room: int, timeout_s: float) -> int:
    """Wait at the prefill's bootstrap port until `room` is prefilled; return its prompt token count."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, asyncio.TimeoutError) as exc:
        raise RendezvousError(f"cannot reach the prefill bootstrap server at {host}:{port}: {exc}") from exc
    try:
        writer.write(f"WAIT {room}\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout_s + 5)
    except (OSError, asyncio.TimeoutError) as exc:
        raise RendezvousError(f"bootstrap room {room} at {host}:{port}: {exc or 'timed out'}") from exc
    finally:
        writer.close()
    words = line.decode("ascii", "replace").split()
    if len(words) == 3 and words[0] == "READY":
        return int(words[2])
    if not words:
        raise RendezvousError(f"prefill at {host}:{port} closed the connection for bootstrap room {room}")
    raise RendezvousError(f"prefill at {host}:{port} answered {' '.join(words)!r} for bootstrap room {room}")
