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
        assert time.monotonic() - start < 5
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
