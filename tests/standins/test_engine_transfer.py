"""The KV transfer's per-rank ports (pd_standins.engine.transfer): opened as SGLang's ZMQ sockets are,
and failing as SGLang's transfer fails when the other host cannot reach them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pd_standins.engine.transfer import RankPorts, TransferError, local_ip
from pd_testlib import reserve_ports


def test_local_ip_is_chosen_as_sglangs_get_local_ip_auto() -> None:
    assert local_ip({"SGLANG_HOST_IP": "10.0.0.5", "HOST_IP": "10.0.0.6"}) == "10.0.0.5"
    assert local_ip({"HOST_IP": "10.0.0.6"}) == "10.0.0.6"
    assert local_ip({"SGLANG_LOCAL_IP_NIC": "lo"}) == "127.0.0.1"
    # Else the default route's source address: never loopback on a host with a network.
    assert local_ip({}) not in ("127.0.0.1", "0.0.0.0")


async def _pair(tp_prefill: int, tp_decode: int) -> tuple[RankPorts, RankPorts]:
    prefill, decode = RankPorts("127.0.0.1", tp_prefill), RankPorts("127.0.0.1", tp_decode)
    await prefill.open()
    await decode.open()
    return prefill, decode


def test_each_rank_gets_an_os_chosen_port_and_the_kv_moves_both_ways() -> None:
    async def run() -> tuple[list[int], list[int], bool]:
        prefill, decode = await _pair(4, 2)
        try:
            pushed = asyncio.ensure_future(prefill.pushed(7, 5))
            await decode.pull(prefill.endpoints, 7, 5)
            return prefill.ports, decode.ports, await pushed
        finally:
            prefill.close()
            decode.close()

    prefill_ports, decode_ports, pushed = asyncio.run(run())
    assert len(set(prefill_ports)) == 4 and len(set(decode_ports)) == 2 and pushed
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert all(low <= p <= high for p in prefill_ports + decode_ports)  # the OS's ephemeral range


def test_a_blocked_prefill_rank_port_fails_the_decode_naming_it() -> None:
    closed = reserve_ports(1)[0]

    async def run() -> None:
        decode = RankPorts("127.0.0.1", 1)
        await decode.open()
        try:
            await decode.pull([f"127.0.0.1:{closed}"], 8, 2)
        finally:
            decode.close()

    with pytest.raises(TransferError, match=f"cannot reach the prefill's rank port 127.0.0.1:{closed}"):
        asyncio.run(run())


def test_a_blocked_decode_rank_port_fails_the_prefill_and_times_the_decode_out() -> None:
    closed = reserve_ports(1)[0]

    async def run() -> tuple[bool, str]:
        prefill, decode = await _pair(1, 1)
        decode.ports = [closed]  # what the prefill host would see behind a firewall: nothing answers
        try:
            pushed = asyncio.ensure_future(prefill.pushed(9, 5))
            with pytest.raises(TransferError) as failed:
                await decode.pull(prefill.endpoints, 9, 1.0)
            return await pushed, str(failed.value)
        finally:
            prefill.close()
            decode.close()

    pushed, message = asyncio.run(run())
    assert pushed is False
    assert "no KV reached this decode's rank ports" in message
