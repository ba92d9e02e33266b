"""The KV transfer's own ports: what SGLang 0.5.23's PD connection opens besides the bootstrap port.

Read in the wheel (sglang/srt/disaggregation/common/conn.py, CommonKVManager.__init__, and
sglang/srt/utils/network.py):
- every TP rank of a prefill or decode worker binds a ZMQ PULL socket at start-up:
  get_zmq_socket_on_host(ctx, zmq.PULL, host=self.local_ip) -> socket.bind_to_random_port(
  "tcp://<local_ip>"); pyzmq's bind_to_random_port with its default range (49152-65536) binds
  "tcp://<ip>:*", so the OS picks the port from net.ipv4.ip_local_port_range (Linux: 32768-60999);
- local_ip = get_local_ip_auto(): SGLANG_HOST_IP or HOST_IP, else the address of the NIC named by
  SGLANG_LOCAL_IP_NIC, else the source address of the default route (a UDP "connect" to 8.8.8.8),
  else the host name's address when not loopback; else "ValueError: Can not get local ip";
- the prefill's ranks register their (ip, rank_port) with its bootstrap server; the decode reads
  them from there (the bootstrap port), sends each prefill rank its own endpoint and the room over
  ZMQ (decode -> prefill rank port), and the prefill reports the room's KV as sent over ZMQ to the
  decode rank's port (prefill -> decode rank port). The KV bytes themselves go over NIXL/UCX
  (UCX's TCP transport also listens on an OS-chosen port: UCX_TCP_PORT_RANGE, default 0).

The engine does the same with one TCP listener per TP rank (bound on local_ip, port from the OS)
and two line messages per room over connections kept per endpoint (SGLang caches its ZMQ PUSH
socket per endpoint: CommonKVManager._socket_cache), so a firewall between the hosts, or a
local_ip on a NIC the other host cannot reach, fails the transfer as it fails SGLang's:

    decode -> prefill rank port:  PULL <room> <decode_ip>:<decode_rank_port>
    prefill -> decode rank port:  KV <room>
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import socket
import struct
import time
from collections.abc import Mapping

from pd_standins.engine.deadline import within

CONNECT_TIMEOUT_S = 5.0


class TransferError(RuntimeError):
    """The KV of a room could not move between the prefill and the decode."""


def _nic_address(name: str) -> str | None:
    """The IPv4 address of interface `name` (SIOCGIFADDR), as netifaces would give it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def local_ip(env: Mapping[str, str] | None = None) -> str:
    """sglang/srt/utils/network.py get_local_ip_auto(), without its IPv6 branch."""
    env = os.environ if env is None else env
    explicit = env.get("SGLANG_HOST_IP", "") or env.get("HOST_IP", "")
    if explicit:
        return explicit
    nic = env.get("SGLANG_LOCAL_IP_NIC")
    if nic and (address := _nic_address(nic)):
        return address
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("8.8.8.8", 80))  # UDP: selects the source address, sends nothing
        return s.getsockname()[0]
    with contextlib.suppress(OSError, IndexError):
        address = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)[0][4][0]
        if address not in ("127.0.0.1", "0.0.0.0"):
            return str(address)
    raise TransferError("ValueError: Can not get local ip")


class RankPorts:
    """One worker's per-TP-rank transfer listeners and the rooms moving through them."""

    def __init__(self, host: str, tp_size: int) -> None:
        self.host = host
        self.tp_size = max(1, int(tp_size))
        self.servers: list[asyncio.AbstractServer] = []
        self.ports: list[int] = []
        # decode side: room -> ranks whose KV arrived, and an event per room
        self._arrived: dict[int, set[int]] = {}
        self._events: dict[int, asyncio.Event] = {}
        # prefill side: room -> result of pushing KV to the decode (True sent, False failed)
        self._pushed: dict[int, asyncio.Future[bool]] = {}
        self._seen: dict[int, float] = {}
        self.links = Links()
        self._tasks: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        for rank in range(self.tp_size):
            handler = functools.partial(self._handle, rank)
            server = await asyncio.start_server(handler, self.host, 0)
            self.servers.append(server)
            self.ports.append(server.sockets[0].getsockname()[1])

    def close(self) -> None:
        for server in self.servers:
            server.close()
        self.links.close()
        for task in self._tasks:
            task.cancel()

    @property
    def endpoints(self) -> list[str]:
        return [f"{self.host}:{port}" for port in self.ports]

    def _expire(self) -> None:
        now = time.monotonic()
        for room in [r for r, t in self._seen.items() if now - t > 600]:
            self._seen.pop(room, None)
            self._arrived.pop(room, None)
            self._events.pop(room, None)
            self._pushed.pop(room, None)

    def _event(self, room: int) -> asyncio.Event:
        self._expire()
        self._seen.setdefault(room, time.monotonic())
        return self._events.setdefault(room, asyncio.Event())

    def _push_result(self, room: int) -> asyncio.Future[bool]:
        self._expire()
        self._seen.setdefault(room, time.monotonic())
        if room not in self._pushed:
            self._pushed[room] = asyncio.get_running_loop().create_future()
        return self._pushed[room]

    async def _handle(self, rank: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One peer's connection: a line per message, as long as the peer keeps it."""
        try:
            while line := await reader.readline():
                words = line.decode("ascii", "replace").split()
                if len(words) == 3 and words[0] == "PULL" and words[1].lstrip("-").isdigit():
                    task = asyncio.ensure_future(self._push(int(words[1]), words[2]))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                elif len(words) == 2 and words[0] == "KV" and words[1].lstrip("-").isdigit():
                    room = int(words[1])
                    self._arrived.setdefault(room, set()).add(rank)
                    self._event(room).set()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _push(self, room: int, decode_endpoint: str) -> None:
        """prefill -> the decode rank's port: the room's KV is there."""
        ok = await self.links.send(decode_endpoint, f"KV {room}\n")
        future = self._push_result(room)
        if not future.done():
            future.set_result(ok)

    # ---- prefill side ---------------------------------------------------------------------------
    async def pushed(self, room: int, timeout_s: float) -> bool:
        """True once the room's KV reached a decode rank; False when the push failed or never came."""
        try:
            return await within(asyncio.shield(self._push_result(room)), timeout_s)
        except asyncio.TimeoutError:
            return False

    # ---- decode side ----------------------------------------------------------------------------
    async def pull(self, prefill_endpoints: list[str], room: int, timeout_s: float) -> None:
        """Ask each prefill rank for the room's KV and wait until every decode rank has its part."""
        if not prefill_endpoints:
            raise TransferError(f"bootstrap room {room}: the prefill registered no rank ports")
        event = self._event(room)
        for rank, port in enumerate(self.ports):
            target = prefill_endpoints[rank % len(prefill_endpoints)]
            if not await self.links.send(target, f"PULL {room} {self.host}:{port}\n"):
                raise TransferError(
                    f"KV transfer of bootstrap room {room}: cannot reach the prefill's rank port {target} "
                    "(a ZMQ port the OS chose from ip_local_port_range: open it between the hosts)"
                )
        deadline = time.monotonic() + timeout_s
        while len(self._arrived.get(room, ())) < self.tp_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransferError(
                    f"KV transfer of bootstrap room {room}: no KV reached this decode's rank ports "
                    f"{self.endpoints} within {timeout_s:g} s (can the prefill host reach them?)"
                )
            event.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await within(event.wait(), left)
        self._arrived.pop(room, None)


class Links:
    """Outgoing connections kept per endpoint; a send opens one when there is none (or it broke)."""

    def __init__(self) -> None:
        self._writers: dict[str, asyncio.StreamWriter] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def send(self, endpoint: str, line: str) -> bool:
        async with self._locks.setdefault(endpoint, asyncio.Lock()):
            for _ in range(2):  # a kept connection the peer closed: open a new one once
                writer = self._writers.get(endpoint)
                if writer is None or writer.is_closing():
                    writer = await _connect(endpoint)
                    if writer is None:
                        return False
                    self._writers[endpoint] = writer
                try:
                    writer.write(line.encode())
                    await writer.drain()
                    return True
                except OSError:
                    self._writers.pop(endpoint, None)
                    writer.close()
            return False

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


async def _connect(endpoint: str) -> asyncio.StreamWriter | None:
    host, _, port = endpoint.rpartition(":")
    try:
        _, writer = await within(asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT_S)
    except (OSError, ValueError, asyncio.TimeoutError):
        return None
    return writer
