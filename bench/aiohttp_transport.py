"""httpx2's transport interface over aiohttp's client (bench only, not the driver's): lightkube
and everything above it unchanged (its models, its requests, cnidra.kube.api's error
classes, the request-counting hook, the tests' MockTransport), only the wire below httpx2
swapped: aiohttp's connection pool (HTTP/1.1 keep-alive, one TLS session a connection) and its
C HTTP parser instead of httpcore2, h2 and anyio's TLS stream. bench.transport measures it
beside the others (issue 42: the transport chosen by measurement).

Each request's httpx2 read timeout becomes aiohttp's socket-read timeout and its connect
timeout aiohttp's connect timeout (a watch: no read timeout, as lightkube asks); aiohttp's
failures come back as httpx2's (ConnectError, ReadError, ReadTimeout, RemoteProtocolError), so
cnidra.kube.api.classify sees what it sees with httpx2's own transport. Bodies are streamed
(a watch is an endless body) and left compressed for httpx2 to decode."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx2
import yarl


def _timeout(request: httpx2.Request) -> aiohttp.ClientTimeout:
    asked: dict[str, Any] = request.extensions.get("timeout") or {}
    return aiohttp.ClientTimeout(
        total=None,
        connect=asked.get("pool"),
        sock_connect=asked.get("connect"),
        sock_read=asked.get("read"),
    )


def _as_httpx(exc: BaseException, request: httpx2.Request) -> httpx2.TransportError:
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, TimeoutError):
        return httpx2.ReadTimeout(message, request=request)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx2.ConnectError(message, request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx2.RemoteProtocolError(message, request=request)
    return httpx2.ReadError(message, request=request)


class _Body(httpx2.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx2.Request) -> None:
        self.response = response
        self.request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _as_httpx(exc, self.request) from exc

    async def aclose(self) -> None:
        self.response.release()


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """One aiohttp session (made on first use, inside the running loop), at most `limit`
    connections; `ssl_context`: the apiserver's CA and the client's certificate (None: plain
    HTTP, the tests' loopback server)."""

    def __init__(self, ssl_context: ssl.SSLContext | None, limit: int = 100) -> None:
        self.ssl_context = ssl_context
        self.limit = limit
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.limit, ssl=self.ssl_context if self.ssl_context is not None else False
            )
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._session

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        session = self._open()
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() != "host"]
        body = await request.aread()
        try:
            response = await session.request(
                request.method,
                yarl.URL(str(request.url), encoded=True),
                headers=headers,
                data=body or None,
                allow_redirects=False,
                timeout=_timeout(request),
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _as_httpx(exc, request) from exc
        return httpx2.Response(
            status_code=response.status,
            headers=list(response.raw_headers),
            stream=_Body(response, request),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
