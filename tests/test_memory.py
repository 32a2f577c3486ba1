"""cnidra.util.memory: the bound on asyncio's TLS read buffers; the startup heap set aside from
the garbage collector."""

from __future__ import annotations

import asyncio
import gc
import ssl
from asyncio import sslproto

import pytest

from cnidra.util.memory import TLS_READ_BYTES, small_tls_reads


def test_tls_connections_made_after_read_at_most_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sslproto.SSLProtocol, "max_size", 256 * 1024)  # restored after
    assert small_tls_reads() == TLS_READ_BYTES

    async def made() -> sslproto.SSLProtocol:
        loop = asyncio.get_running_loop()
        return sslproto.SSLProtocol(
            loop,
            asyncio.Protocol(),
            ssl.create_default_context(),
            loop.create_future(),
            server_hostname="apiserver.test",
        )

    protocol = asyncio.run(made())
    assert len(protocol.get_buffer(-1)) == TLS_READ_BYTES  # what one read fills at most
    assert len(protocol.get_buffer(1 << 20)) == TLS_READ_BYTES


def test_a_smaller_size_in_force_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sslproto.SSLProtocol, "max_size", 16 * 1024)
    assert small_tls_reads() == 16 * 1024


def test_settle_gc_freezes_what_is_held_and_collects_the_young_later() -> None:

    from cnidra.util.memory import YOUNG_COLLECTION, settle_gc

    before = gc.get_threshold()
    try:
        frozen = settle_gc()
        assert frozen == gc.get_freeze_count() > 0  # this process's modules, at least
        assert gc.get_threshold() == (YOUNG_COLLECTION, before[1], before[2])
        # cyclic garbage made after is still collected
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
