"""The node's pods watched through the kube layer (cnidra.kube.pods), node-scoped as kubelet
watches them, and a bound pod's claim read ahead through the claim reader prepare uses: then
NodePrepareResources asks the apiserver nothing (cnidra.dra.ahead, issue 42)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from cnidra.api.refs import ObjectRef
from cnidra.dra.ahead import ClaimsAhead, ReadAhead
from cnidra.dra.prepare import Preparer
from cnidra.kube.api import Transient
from cnidra.kube.claims import ClaimGetter
from cnidra.kube.pods import NodePods
from cnidra.state.checkpoint import Checkpoint
from cnidra.state.layout import StateLayout
from tests.dra.test_prepare import DIRS, VIEW, claim
from tests.kube.fakeapi import NODE, FakeApiserver, Request, allocated_claim


class WatchingApiserver(FakeApiserver):
    """The fake apiserver, and a watch of pods that streams `events` and ends."""

    def __init__(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        super().__init__()
        self.events = events
        self.watches: list[dict[str, list[str]]] = []

    def handle(self, request: Request) -> tuple[int, Any]:
        params = parse_qs(request.query)
        if request.path == "/api/v1/pods" and params.get("watch"):
            self.watches.append(params)
            if len(self.watches) > 1:  # the client watches again when a watch ends: refused
                return 500, {"kind": "Status", "code": 500}
            lines = b"".join(
                json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                for kind, obj in self.events
            )
            return 200, lines
        return super().handle(request)


def bound_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "team-a", "name": "web-0", "uid": "pod-uid"},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "t"}],
        },
        "status": {
            "phase": "Pending",
            "resourceClaimStatuses": [{"name": "dev", "resourceClaimName": "web-0-dev-x"}],
        },
    }


async def test_a_bound_pods_claim_is_prepared_without_a_get(tmp_path: Path) -> None:
    api = WatchingApiserver([("ADDED", bound_pod())])
    configs = claim()["status"]["allocation"]["devices"]["config"]
    for config in configs:
        if config.get("requests"):
            config["requests"] = ["dev"]  # the fake's request
    api.claims["team-a", "web-0-dev-x"] = allocated_claim(
        "team-a", "web-0-dev-x", "claim-uid", "web-0", "pod-uid", configs
    )
    client = api.client()
    claims = ClaimGetter(client)
    preparer = Preparer(NODE, claims, Checkpoint(StateLayout(tmp_path)), DIRS, view=lambda: VIEW)
    preparer.ahead = ClaimsAhead()
    ahead = ReadAhead(NodePods(client, NODE).watch, claims, preparer.ahead, preparer.warm)
    async with asyncio.timeout(10):
        with pytest.raises(Transient):  # a watch refused, classified as any answer is
            await ahead.watch_once()
        await ahead.drained()
    watch = api.watches[0]  # every namespace's pods, this node's only
    assert watch.get("fieldSelector") == [f"spec.nodeName={NODE},status.phase=Pending"]
    assert [verb for verb, _, _ in api.log] == ["get"]  # the claim, read ahead
    api.log.clear()
    prepared = await preparer.prepare(ObjectRef("team-a", "web-0-dev-x", "claim-uid"))
    await client.close()
    assert prepared.devices and api.log == []  # prepare asked the apiserver nothing


@pytest.mark.parametrize("policy", [True, False])
async def test_the_read_ahead_keeps_its_node_scoped_watch_policy_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: bool
) -> None:
    """The read-ahead watches the node's pods itself; network policy's watch of every pod
    runs only while a policy exists (cnidra.kube.netpolicy.PolicyGate), so it cannot be
    what feeds the read-ahead."""
    from tests.fakenode import FakeNode

    api = FakeApiserver()
    node = FakeNode(tmp_path, api, network_policy=policy)
    d = node.driver
    assert d.read_ahead is not None
    spawned: dict[str, Any] = {}
    monkeypatch.setattr(d.tasks, "spawn", lambda name, run, **kw: spawned.setdefault(name, run))
    monkeypatch.setattr(d.policy, "restore", lambda: None)
    d._watch_pods()
    assert spawned["claims-ahead"] == d.read_ahead.run
    assert ("netpolicy-watches" in spawned) == policy
    await d.client.close()
