"""ttrpc, containerd's lightweight RPC, over one logical connection. Written by hand: there is
no Python implementation.

A message is a 10-byte header (big-endian uint32 length, uint32 stream ID, uint8 type, uint8
flags) and a protobuf payload: a `ttrpc.Request` (type 1) or a `ttrpc.Response` (type 2) that
answers the request with the same stream ID. Clients number their streams 1, 3, 5, ...
Requests are served concurrently, so several may be in flight on one connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from cnidra._proto.ttrpc import ttrpc_pb2

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIBB")
TYPE_REQUEST = 1
TYPE_RESPONSE = 2
TYPE_DATA = 3
MAX_MESSAGE = 4 << 20

# grpc status codes ttrpc reuses
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, UNIMPLEMENTED, UNAVAILABLE = (
    0,
    1,
    2,
    3,
    4,
    12,
    14,
)

Write = Callable[[bytes], Awaitable[None]]
Handler = Callable[[bytes], Awaitable[bytes]]


class TTRPCError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"ttrpc status {code}: {message}")
        self.code = code
        self.message = message


class ConnectionClosed(TTRPCError):
    def __init__(self, reason: str = "connection closed") -> None:
        super().__init__(UNAVAILABLE, reason)


@dataclass(frozen=True)
class Message:
    stream_id: int
    type: int
    flags: int
    payload: bytes


def encode(stream_id: int, msg_type: int, payload: bytes, flags: int = 0) -> bytes:
    if len(payload) > MAX_MESSAGE:
        raise TTRPCError(8, f"message of {len(payload)} bytes exceeds {MAX_MESSAGE}")
    return HEADER.pack(len(payload), stream_id, msg_type, flags) + payload


async def read_message(reader: asyncio.StreamReader) -> Message:
    header = await reader.readexactly(HEADER.size)
    length, stream_id, msg_type, flags = HEADER.unpack(header)
    if length > MAX_MESSAGE:
        raise TTRPCError(8, f"message of {length} bytes exceeds {MAX_MESSAGE}")
    payload = await reader.readexactly(length) if length else b""
    return Message(stream_id, msg_type, flags, payload)


class Server:
    """Serves requests arriving on `reader`, one task per request, answering via `write`."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        write: Write,
        services: Mapping[str, Mapping[str, Handler]],
    ) -> None:
        self.reader = reader
        self.write = write
        self.services = services
        self._inflight: set[asyncio.Task[None]] = set()

    async def serve(self) -> None:
        try:
            while True:
                try:
                    msg = await read_message(self.reader)
                except asyncio.IncompleteReadError:
                    return  # the runtime closed the connection
                if msg.type != TYPE_REQUEST:
                    log.debug("ignoring ttrpc message of type %d", msg.type)
                    continue
                task = asyncio.create_task(self._handle(msg))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
        finally:
            for task in list(self._inflight):
                task.cancel()

    async def _handle(self, msg: Message) -> None:
        request = ttrpc_pb2.Request.FromString(msg.payload)
        response = ttrpc_pb2.Response()
        handler = self.services.get(request.service, {}).get(request.method)
        if handler is None:
            response.status.code = UNIMPLEMENTED
            response.status.message = f"{request.service}/{request.method} is not implemented"
        else:
            timeout = request.timeout_nano / 1e9 if request.timeout_nano > 0 else None
            try:
                async with asyncio.timeout(timeout):
                    response.payload = await handler(request.payload)
            except TimeoutError:
                response.status.code = DEADLINE_EXCEEDED
                response.status.message = f"{request.method} did not finish within {timeout:g}s"
            except TTRPCError as exc:
                response.status.code = exc.code
                response.status.message = exc.message
            except Exception as exc:
                log.exception("ttrpc handler %s failed", request.method)
                response.status.code = UNKNOWN
                response.status.message = str(exc) or type(exc).__name__
        with contextlib.suppress(ConnectionError):
            await self.write(encode(msg.stream_id, TYPE_RESPONSE, response.SerializeToString()))


class Client:
    """Calls a service over `reader`/`write`; responses are matched to calls by stream ID."""

    def __init__(self, reader: asyncio.StreamReader, write: Write) -> None:
        self.reader = reader
        self.write = write
        self._next_stream = 1
        self._pending: dict[int, asyncio.Future[ttrpc_pb2.Response]] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed: str | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._receive(), name="ttrpc-client")

    async def _receive(self) -> None:
        reason = "connection closed"
        try:
            while True:
                msg = await read_message(self.reader)
                if msg.type != TYPE_RESPONSE:
                    continue
                future = self._pending.pop(msg.stream_id, None)
                if future is not None and not future.done():
                    future.set_result(ttrpc_pb2.Response.FromString(msg.payload))
        except asyncio.IncompleteReadError:
            pass
        except Exception as exc:
            reason = f"connection failed: {exc}"
        finally:
            self._closed = reason
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionClosed(reason))
            self._pending.clear()

    async def call(
        self, service: str, method: str, payload: bytes, deadline: float | None = None
    ) -> bytes:
        if self._closed is not None:
            raise ConnectionClosed(self._closed)
        stream_id = self._next_stream
        self._next_stream += 2
        request = ttrpc_pb2.Request(
            service=service,
            method=method,
            payload=payload,
            timeout_nano=int(deadline * 1e9) if deadline else 0,
        )
        future: asyncio.Future[ttrpc_pb2.Response] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = future
        try:
            await self.write(encode(stream_id, TYPE_REQUEST, request.SerializeToString()))
            async with asyncio.timeout(deadline):  # also sent to the server as timeout_nano
                response = await future
        finally:
            self._pending.pop(stream_id, None)
        if response.status.code != OK:
            raise TTRPCError(response.status.code, response.status.message)
        return bytes(response.payload)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
