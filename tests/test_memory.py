"""cnidra.util.memory: the bound on asyncio's TLS read buffers; the startup heap set aside from
the garbage collector."""

from __future__ import annotations

import asyncio
import gc
import ssl
from asyncio import sslproto

import pytest

from cnidra.util.memory import TLS_READ_BYTES, freeze_startup_heap, small_tls_reads


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


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_the_startup_heap_is_set_aside_and_later_cycles_still_collected() -> None:
    """What is alive once started is frozen (full collections skip it); a reference cycle
    made after is still collected, and what was frozen is still freed when unreferenced."""
    try:
        kept = Node()
        frozen = freeze_startup_heap()
        assert frozen == gc.get_freeze_count() > 0
        assert all(o is not kept for o in gc.get_objects())  # set aside
        a, b = Node(), Node()
        a.other, b.other = b, a
        assert any(o is a for o in gc.get_objects())
        del a, b
        assert gc.collect() >= 2  # the cycle made after the freeze
    finally:
        gc.unfreeze()  # the rest of the suite's process as it was
