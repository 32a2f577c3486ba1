"""cnidra.util.memory: the bound on asyncio's TLS read buffers."""

from __future__ import annotations

import asyncio
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
