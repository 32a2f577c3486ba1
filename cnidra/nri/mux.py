"""NRI's connection multiplexer, in asyncio.

One unix-socket stream carries several logical connections. Every frame is an 8-byte header,
big-endian uint32 connection ID then uint32 payload length, followed by the payload. Each
logical connection is a byte stream of its own: a message written to it may span frames.
Connection 1 carries the plugin's service (the runtime calls the plugin), connection 2 the
runtime's (the plugin calls the runtime). Written by hand: no Python implementation exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct

HEADER = struct.Struct(">II")
PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2
# ttrpc's largest message (4 MiB) plus its 10-byte header: the most one frame may carry.
MAX_FRAME_PAYLOAD = 10 + (4 << 20)


class MuxClosed(ConnectionError):
    pass


class Mux:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._conns: dict[int, asyncio.StreamReader] = {}
        self._write_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        self.error: BaseException | None = None

    def open(self, conn_id: int) -> asyncio.StreamReader:
        if conn_id == 0:
            raise ValueError("connection ID 0 is reserved")
        return self._conns.setdefault(conn_id, asyncio.StreamReader(limit=2 * MAX_FRAME_PAYLOAD))

    def start(self) -> None:
        self._task = asyncio.create_task(self._read_frames(), name="nri-mux-reader")

    async def _read_frames(self) -> None:
        try:
            while True:
                header = await self._reader.readexactly(HEADER.size)
                conn_id, length = HEADER.unpack(header)
                if length > MAX_FRAME_PAYLOAD:
                    raise MuxClosed(f"frame of {length} bytes exceeds {MAX_FRAME_PAYLOAD}")
                payload = await self._reader.readexactly(length) if length else b""
                self.open(conn_id).feed_data(payload)
        except (asyncio.IncompleteReadError, ConnectionError, MuxClosed) as exc:
            self.error = exc
        finally:
            for conn in self._conns.values():
                conn.feed_eof()
            self.closed.set()

    async def write(self, conn_id: int, data: bytes) -> None:
        if self.closed.is_set():
            raise MuxClosed("multiplexed connection is closed")
        async with self._write_lock:
            view = memoryview(data)
            while True:
                chunk, view = view[:MAX_FRAME_PAYLOAD], view[MAX_FRAME_PAYLOAD:]
                self._writer.write(HEADER.pack(conn_id, len(chunk)) + bytes(chunk))
                if not view:
                    break
            try:
                await self._writer.drain()
            except ConnectionError as exc:
                raise MuxClosed(str(exc)) from exc

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            self._writer.close()
            await self._writer.wait_closed()
        for conn in self._conns.values():
            conn.feed_eof()
        self.closed.set()
