"""The admission webhook over real HTTPS: AdmissionReviews in, verdicts with field paths out."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cnidra.admission.webhook import WebhookServer
from tests.api.test_policy import DEFAULT_CLASSES, MACVLAN, claim, network

CLASSES = {c["metadata"]["name"]: c for c in DEFAULT_CLASSES}


def self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "tls.crt", tmp / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[tuple[str, ssl.SSLContext]]:
    cert, key = self_signed(tmp_path)
    server = WebhookServer(
        "127.0.0.1:0",
        str(cert),
        str(key),
        CLASSES.get,
        lambda ns: {"team": ns},
    )
    server.start()
    context = ssl.create_default_context(cafile=str(cert))
    yield f"https://127.0.0.1:{server.port}/validate", context
    server.shutdown()


def post(url: str, context: ssl.SSLContext, body: Any) -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def admission(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": "CREATE", "namespace": "team-a", "object": obj},
    }


def test_a_claim_within_the_policy_is_admitted(webhook: tuple[str, ssl.SSLContext]) -> None:
    answer = post(*webhook, admission(claim(network(MACVLAN))))["response"]
    assert answer == {"uid": "u-1", "allowed": True}


def test_a_claim_the_driver_would_refuse_is_refused_naming_the_field(
    webhook: tuple[str, ssl.SSLContext],
) -> None:
    bad = claim(network({"type": "bridge", "ipMasq": True, "isGateway": True}))
    answer = post(*webhook, admission(bad))["response"]
    assert answer["allowed"] is False and answer["uid"] == "u-1"
    message = answer["status"]["message"]
    assert "spec.devices.config[0].opaque.parameters.config.plugins[0].ipMasq: never" in message
    assert "plugins[0].isGateway" in message


def test_a_template_is_checked_like_a_claim(webhook: tuple[str, ssl.SSLContext]) -> None:
    inner = claim(network({"type": "host-device", "device": "eth0"}))
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {"spec": inner["spec"]},
    }
    answer = post(*webhook, admission(template))["response"]
    assert not answer["allowed"]
    assert "spec.spec.devices.config[0]" in answer["status"]["message"]


def test_deep_nesting_is_refused_without_a_crash(webhook: tuple[str, ssl.SSLContext]) -> None:
    deep = "[" * 5000 + "]" * 5000
    body = (
        '{"request": {"uid": "u-2", "operation": "CREATE", "object": {"kind": "ResourceClaim", '
        f'"spec": {{"x": {deep}}}}}}}}}'
    ).encode()
    answer = post(*webhook, body)["response"]
    assert answer["allowed"] is False and "nested" in answer["status"]["message"]


def test_deletes_are_admitted(webhook: tuple[str, ssl.SSLContext]) -> None:
    body = admission(claim(network({"type": "evil"})))
    body["request"]["operation"] = "DELETE"
    assert post(*webhook, body)["response"]["allowed"] is True


def test_the_shipped_classes_parse() -> None:
    assert [c["kind"] for c in DEFAULT_CLASSES] == ["DeviceClass", "DeviceClass"]
    assert yaml.safe_dump(DEFAULT_CLASSES[0])


def test_idle_and_slow_connections_do_not_stop_reviews(
    webhook: tuple[str, ssl.SSLContext],
) -> None:
    """One idle TCP connection used to block every review (the TLS handshake ran in the accept
    loop with no timeout; with failurePolicy Fail that stops every claim in the cluster)."""
    import socket
    import time
    from urllib.parse import urlparse

    url, context = webhook
    port = urlparse(url).port
    assert port is not None
    held: list[socket.socket] = []
    try:
        for _ in range(50):  # connected, never a ClientHello
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        for _ in range(20):  # TLS done, then a request that never ends
            raw = socket.create_connection(("127.0.0.1", port), timeout=5)
            tls = context.wrap_socket(raw, server_hostname="127.0.0.1")
            tls.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
            held.append(tls)
        start = time.monotonic()
        for _ in range(10):
            answer = post(url, context, admission(claim(network(MACVLAN))))["response"]
            assert answer["allowed"] is True
        # before the held ones are cut (their body bound, 10 s): reviews that waited for
        # them take longer, and one blocked for good fails post's own 10 s. Not < 5 s: ten
        # TLS reviews on a loaded machine can take that.
        assert time.monotonic() - start < 10
    finally:
        for sock in held:
            sock.close()


def test_bodies_that_are_not_reviews_are_refused(webhook: tuple[str, ssl.SSLContext]) -> None:
    for body in (b"not json", b'{"a": 1, "a": 2}', b"[1]", b'{"x": ' + b"9" * 5000 + b"}"):
        answer = post(*webhook, body)
        assert answer.get("response", {}).get("allowed") is False or "error" in answer, answer


def test_a_class_that_cannot_be_found_is_a_refusal_not_an_unchecked_admission() -> None:
    """Found on the test bed: a lookup before the class existed was cached as None, and the
    next claim was admitted with only a warning that its policy was not checked."""
    from cnidra.admission.webhook import TTLCache, review

    reads: list[str] = []

    def read(name: str) -> dict[str, Any] | None:
        reads.append(name)
        return CLASSES.get(name) if len(reads) > 1 else None  # created after the first read

    lookup = TTLCache(read)
    body = admission(claim(network(MACVLAN)))
    first = review(body, lookup, lambda ns: {})["response"]
    assert first["allowed"] is False and "not found" in first["status"]["message"]
    assert review(body, lookup, lambda ns: {})["response"]["allowed"] is True  # not cached


def test_a_claim_cannot_make_the_webhook_fan_out_without_bound() -> None:
    from cnidra.admission.webhook import MAX_CLASSES, review

    reads: list[str] = []

    def read(name: str) -> dict[str, Any] | None:
        reads.append(name)
        return CLASSES.get(name)

    doc = claim(network(MACVLAN))
    doc["spec"]["devices"]["requests"] = [
        {"name": f"r{i}", "exactly": {"deviceClassName": f"c{i}.example.com"}} for i in range(500)
    ]
    answer = review(admission(doc), read, lambda ns: {})["response"]
    assert answer["allowed"] is False and f"at most {MAX_CLASSES}" in answer["status"]["message"]
    assert reads == []


def _closed_within(sock: Any, seconds: float) -> bytes:
    """What the server sent before it closed the connection, waiting at most `seconds`;
    fails if the connection is still open then."""
    import time

    deadline = time.monotonic() + seconds
    received = b""
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"still open after {seconds}s (received {received[:60]!r})"
        sock.settimeout(left)
        try:
            chunk = sock.recv(4096)
        except (ConnectionResetError, ssl.SSLError):
            return received
        except TimeoutError:
            continue
        if not chunk:
            return received
        received += chunk


# 2 s, not 0.5: a TLS handshake and a review on a loaded machine took longer than half a
# second, and the connection was cut before it had asked anything
QUICK = 2.0


@pytest.fixture
def quick_timeouts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """A webhook whose head, keep-alive and body bounds are QUICK seconds (10 s, 30 s and 10 s
    as shipped), and whose connection limit is `limit`."""
    from cnidra.admission import webhook as module

    monkeypatch.setattr(module, "HEAD_SECONDS", QUICK)
    monkeypatch.setattr(module, "KEEP_ALIVE_SECONDS", QUICK)
    monkeypatch.setattr(module, "BODY_SECONDS", QUICK)
    cert, key = self_signed(tmp_path)
    servers: list[WebhookServer] = []

    def start(limit: int = module.MAX_CONNECTIONS) -> tuple[int, ssl.SSLContext]:
        server = WebhookServer(
            "127.0.0.1:0", str(cert), str(key), CLASSES.get, lambda ns: {}, max_connections=limit
        )
        server.start()
        servers.append(server)
        return server.port, ssl.create_default_context(cafile=str(cert))

    yield start
    for server in servers:
        server.shutdown()


def test_connections_that_ask_nothing_or_trickle_are_closed(quick_timeouts: Any) -> None:
    """Issue 26: uvicorn's keep-alive timer covers only a connection idle after a response (and
    stops at a next request's first byte), so a client that finished the TLS handshake and then
    sent nothing, or half a request head, held its connection for ever; a body trickled a byte
    at a time held it as long as it pleased."""
    import socket
    import time

    port, context = quick_timeouts()

    def tls() -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        return context.wrap_socket(raw, server_hostname="127.0.0.1")

    made: list[ssl.SSLSocket] = []
    try:
        # each made just before its first bytes: its head is due QUICK s after it connects
        silent, half_head = tls(), tls()
        made += [silent, half_head]
        half_head.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\n")
        body = json.dumps(admission(claim(network(MACVLAN)))).encode()
        after_review = tls()
        made.append(after_review)
        after_review.sendall(
            b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        after_review.settimeout(30)
        assert b" 200 " in after_review.recv(65536).split(b"\r\n", 1)[0]
        after_review.sendall(b"P")  # a next request begun: uvicorn's keep-alive timer stops
        trickle = tls()
        made.append(trickle)
        trickle.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        start = time.monotonic()
        while time.monotonic() - start < QUICK * 3:  # a byte every 0.1 s: each read is quick
            try:
                trickle.sendall(b" ")
            except OSError:
                break
            time.sleep(0.1)
        # bounds for a hang (a connection never closed), not for a slow machine
        assert b" 408 " in _closed_within(trickle, 30).split(b"\r\n", 1)[0]
        _closed_within(silent, 30)
        _closed_within(half_head, 30)
        _closed_within(after_review, 30)
    finally:
        for sock in made:
            sock.close()


def test_connections_held_up_to_the_limit_are_freed_and_reviews_go_on(
    quick_timeouts: Any,
) -> None:
    """Enough held connections to reach the limit turned every review into a 503 for as long
    as they were held (under failurePolicy Fail, every cnidra claim refused)."""
    import socket
    import time
    import urllib.error

    port, context = quick_timeouts(limit=16)
    url = f"https://127.0.0.1:{port}/validate"
    held = []
    try:
        for _ in range(16):
            raw = socket.create_connection(("127.0.0.1", port), timeout=5)
            held.append(context.wrap_socket(raw, server_hostname="127.0.0.1"))
        deadline = time.monotonic() + 30  # a hang's bound: they are cut at QUICK s
        while True:
            try:
                answer = post(url, context, admission(claim(network(MACVLAN))))
                break
            except urllib.error.HTTPError as exc:  # 503 while the held ones count
                assert exc.code == 503
                assert time.monotonic() < deadline, "held connections never freed"
                time.sleep(0.2)
        assert answer["response"]["allowed"] is True
    finally:
        for sock in held:
            sock.close()


def test_a_flood_of_distinct_class_names_keeps_the_cache_and_lookups_bounded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 26: the class cache never evicted (256 names in a request were 256 GETs; ~4,500
    dry-run requests filled the webhook's memory limit). A flood of reviews, each naming the
    most classes allowed, every name new, over real HTTPS beside held-open connections: every
    review answered, at most MAX_CLASSES lookups each, the cache never past its bound."""
    import socket
    from concurrent.futures import ThreadPoolExecutor as Pool

    from cnidra.admission import webhook as module

    monkeypatch.setattr(module, "CACHE_MAX", 64)
    template = CLASSES[next(iter(CLASSES))]
    reads: list[str] = []

    def read(name: str) -> dict[str, Any]:
        reads.append(name)
        return {**template, "metadata": {**template["metadata"], "name": name}}

    classes = module.TTLCache(read)
    cert, key = self_signed(tmp_path)
    server = WebhookServer("127.0.0.1:0", str(cert), str(key), classes, lambda ns: {})
    server.start()
    context = ssl.create_default_context(cafile=str(cert))
    url = f"https://127.0.0.1:{server.port}/validate"
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(50)]
    reviews = 60

    def one(i: int) -> bool:
        doc = claim(network(MACVLAN))
        doc["spec"]["devices"]["requests"] = [
            {"name": f"r{j}", "exactly": {"deviceClassName": f"c{i}-{j}.example.com"}}
            for j in range(module.MAX_CLASSES)
        ]
        return "allowed" in post(url, context, admission(doc))["response"]

    try:
        with Pool(4) as pool:
            answered = list(pool.map(one, range(reviews)))
    finally:
        for sock in held:
            sock.close()
        server.shutdown()
    assert all(answered) and len(answered) == reviews
    assert len(reads) == reviews * module.MAX_CLASSES  # one GET per new name, no more
    assert len(classes._items) <= 64
