#!/usr/bin/env python3
"""Forwards a loopback TCP port of another network namespace to the same port on this
namespace's loopback: the second node's kubelet, driver and host-network pods reach the
apiserver at 127.0.0.1 as the first node's do, and nothing listens beyond loopback.

    forward.py <netns name, or a namespace file's path> <port>

The listening socket is made inside the namespace (a socket keeps the namespace it was made
in); every connection it accepts is relayed to 127.0.0.1:<port> here. Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import socket
import sys

CLONE_NEWNET = 0x40000000


def setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def listener_in(netns: str, port: int) -> socket.socket:
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns if netns.startswith("/") else f"/run/netns/{netns}", os.O_RDONLY)
    try:
        setns(target)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        sock.setblocking(False)
    finally:
        setns(home)
        os.close(home)
        os.close(target)
    return sock


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def relay(port: int, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
    try:
        upstream_r, upstream_w = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), 10
        )
    except (OSError, TimeoutError):
        client_w.close()
        return
    await asyncio.gather(pump(client_r, upstream_w), pump(upstream_r, client_w))


async def serve(netns: str, port: int) -> None:
    sock = listener_in(netns, port)
    server = await asyncio.start_server(lambda r, w: relay(port, r, w), sock=sock)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], int(sys.argv[2])))
