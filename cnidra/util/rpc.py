"""gRPC on unix sockets through grpclib (pure Python, over h2): the kubelet-facing services and
the node API. grpcio's C core cost the driver about 14 MiB of RSS for a handful of small
calls a minute (issue 42); grpclib costs about 4.

A service is a table of methods, `{"/package.Service/Method": Method(...)}`; its functions
take (request, context) and return the reply, or yield the replies of a server stream, as
grpc.aio's servicers did. `RPCServer` adds what grpc.aio's server gave: a bound on the calls
in flight (RESOURCE_EXHAUSTED beyond it), a bound on a request's size (RESOURCE_EXHAUSTED),
a graceful stop (new calls UNAVAILABLE, those in flight given a grace), and the socket
removed when it stops (grpc's core unlinks its unix sockets too)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from grpclib.config import Configuration
from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from cnidra.util.aio import wait_set

__all__ = ["GRPCError", "Status"]

# grpc's default bound on a received message
MAX_RECEIVE = 4 * 1024 * 1024


class Context:
    """What a method gets beside its request: grpc.aio's `context.abort`."""

    async def abort(self, code: Status, details: str) -> NoReturn:
        raise GRPCError(code, details)


CONTEXT = Context()


@dataclass(frozen=True)
class Method:
    """One method: `func(request, context)` returns the reply (unary) or yields the replies
    (stream=True). A reply type of `bytes` sends what func gives as it is (serialized once
    for several services)."""

    func: Callable[[Any, Context], Any]
    request_type: type[Any]
    reply_type: type[Any]
    stream: bool = False


Methods = Mapping[str, Method]


def service_methods(service: str, methods: Mapping[str, Method]) -> dict[str, Method]:
    """{"Method": ...} of one service -> {"/service/Method": ...}."""
    return {f"/{service}/{name}": method for name, method in methods.items()}


class LimitedCodec(ProtoCodec):
    """Protobuf, refusing a message over `limit` bytes as grpc does (RESOURCE_EXHAUSTED), and
    passing bytes through for a reply type of bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def encode(self, message: Any, message_type: Any) -> bytes:
        if message_type is bytes:
            return bytes(message)
        return super().encode(message, message_type)

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self.limit:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({len(data)} vs. {self.limit})",
            )
        if message_type is bytes:
            return data
        return super().decode(data, message_type)


class Calls:
    """The calls a server has in flight: bounded, refused once it stops, waited for."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.active = 0
        self.closing = False
        self.idle = asyncio.Event()
        self.idle.set()

    def enter(self) -> None:
        if self.closing:
            raise GRPCError(Status.UNAVAILABLE, "the server is stopping")
        if self.limit is not None and self.active >= self.limit:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!")
        self.active += 1
        self.idle.clear()

    def leave(self) -> None:
        self.active -= 1
        if not self.active:
            self.idle.set()


def _handler(method: Method, calls: Calls) -> Handler:
    async def unary(stream: Stream[Any, Any]) -> None:
        calls.enter()
        try:
            request = await stream.recv_message()
            reply = await method.func(request, CONTEXT)
            await stream.send_message(reply)
        finally:
            calls.leave()

    async def server_stream(stream: Stream[Any, Any]) -> None:
        calls.enter()
        try:
            request = await stream.recv_message()
            replies: AsyncIterator[Any] = method.func(request, CONTEXT)
            async for reply in replies:
                await stream.send_message(reply)
        finally:
            calls.leave()

    if method.stream:
        return Handler(
            server_stream, Cardinality.UNARY_STREAM, method.request_type, method.reply_type
        )
    return Handler(unary, Cardinality.UNARY_UNARY, method.request_type, method.reply_type)


class _Servable:
    def __init__(self, mapping: dict[str, Handler]) -> None:
        self.mapping = mapping

    def __mapping__(self) -> dict[str, Handler]:
        return self.mapping


class RPCServer:
    """A grpclib server of `methods` (and grpclib servables such as its health service) on
    a unix socket."""

    def __init__(
        self,
        methods: Methods,
        *,
        extra: Iterable[Any] = (),
        max_rpcs: int | None = None,
        max_receive: int = MAX_RECEIVE,
        keepalive: tuple[float, float] | None = None,
    ) -> None:
        """`keepalive`: (seconds between pings of an idle connection, seconds to wait for the
        answer); None: grpc's server defaults (2 h, 20 s)."""
        self.calls = Calls(max_rpcs)
        handlers = {name: _handler(m, self.calls) for name, m in methods.items()}
        config = (
            Configuration(_keepalive_time=keepalive[0], _keepalive_timeout=keepalive[1])
            if keepalive is not None
            else None
        )
        self.server = Server(
            [_Servable(handlers), *extra], codec=LimitedCodec(max_receive), config=config
        )
        self.socket: Path | None = None
        self._inode: int | None = None

    async def start(self, socket: Path) -> None:
        await self.server.start(path=str(socket))
        self.socket = socket
        self._inode = os.stat(socket).st_ino

    async def stop(self, grace: float | None) -> None:
        """New calls get UNAVAILABLE; those in flight have `grace` seconds to end (None: none),
        then are cancelled; the socket goes (unless another server has replaced it)."""
        self.calls.closing = True
        if grace:
            await wait_set(self.calls.idle, grace)
        self.server.close()
        await self.server.wait_closed()
        if self.socket is not None:
            with contextlib.suppress(FileNotFoundError):
                if os.stat(self.socket).st_ino == self._inode:
                    self.socket.unlink()
