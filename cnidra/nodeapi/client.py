"""The node API's client (`cnidra node`): synchronous calls over grpclib, each with its own
connection and a timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from grpclib.client import Channel, UnaryStreamMethod, UnaryUnaryMethod
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from cnidra.util.rpc import Status

Reply = TypeVar("Reply")
SERVICE = "cnidra.node.v1alpha1.NodeNetworks"


class NodeAPIError(Exception):
    """A call that failed: the gRPC status (UNAVAILABLE when nothing answers) and why."""

    def __init__(self, code: Status, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class NodeClient:
    def __init__(self, socket: Path) -> None:
        self.socket = socket

    def call(self, method: str, request: Any, reply_type: type[Reply], timeout: float) -> Reply:
        async def call(channel: Channel) -> Reply:
            rpc = UnaryUnaryMethod[Any, Reply](
                channel, f"/{SERVICE}/{method}", type(request), reply_type
            )
            return await rpc(request, timeout=timeout)

        reply: Reply = self._run(call)
        return reply

    def stream(
        self,
        method: str,
        request: Any,
        reply_type: type[Reply],
        timeout: float | None,
        each: Callable[[Reply], None],
    ) -> None:
        """Calls `each` with every reply of a server stream, as they come."""

        async def follow(channel: Channel) -> None:
            rpc = UnaryStreamMethod[Any, Reply](
                channel, f"/{SERVICE}/{method}", type(request), reply_type
            )
            async with rpc.open(timeout=timeout) as stream:
                await stream.send_message(request, end=True)
                async for reply in stream:
                    each(reply)

        self._run(follow)

    def _run(self, work: Callable[[Channel], Any]) -> Any:
        async def run() -> Any:
            channel = Channel(path=str(self.socket))
            try:
                return await work(channel)
            finally:
                channel.close()

        try:
            return asyncio.run(run())
        except GRPCError as exc:
            raise NodeAPIError(exc.status, exc.message or exc.status.name) from None
        except TimeoutError:
            raise NodeAPIError(Status.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        except (OSError, ProtocolError, StreamTerminatedError) as exc:
            raise NodeAPIError(Status.UNAVAILABLE, str(exc) or type(exc).__name__) from None
