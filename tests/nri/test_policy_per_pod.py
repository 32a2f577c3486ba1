"""Network policy's work for one pod does not grow with the pods gone before it (issue 42): a
pod deleted leaves nothing in policy's memory, so the next pod's attach builds its network's
tables over the pods that are there, not over every pod the node ever ran. Counted on the
driver itself (tests/fakenode.py, as bench.pod_cpu runs it), by calls, not by time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cnidra.api import netpolicy_node
from tests.fakenode import FakeNode
from tests.kube.fakeapi import FakeApiserver


async def test_a_pods_policy_work_is_the_same_for_the_first_pod_and_the_tenth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    on = netpolicy_node.PodFacts.on

    def counted(self: netpolicy_node.PodFacts, network: str) -> Any:
        nonlocal calls
        calls += 1
        return on(self, network)

    monkeypatch.setattr(netpolicy_node.PodFacts, "on", counted)
    node = FakeNode(tmp_path, FakeApiserver(), fake_plugins=True)
    policy = node.driver.policy
    per_pod = []
    async with node.running():
        for i in range(10):
            calls = 0
            await node.pod(i)
            per_pod.append(calls)
            # the pod's deletion reached policy (as its pod watch brings it): nothing kept
            assert not policy.node.pods and not policy.node.local and not policy.local
    assert per_pod[0] > 0  # the attach did reach policy: the count means something
    assert per_pod == [per_pod[0]] * 10, per_pod
