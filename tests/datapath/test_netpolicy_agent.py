"""Issue 43 end to end on one machine: the agent-side reconciler (cnidra.nri.netpolicy), fed as
the watches feed it, drives the real datapath (nft in each pod's namespace) for two pods the
test makes (tests/datapath/policylab.py: a and b on a bridge, 198.18.43.0/24), and TCP probes
prove each step: a default deny before the sync, the policies once synced, an edit, a restart
that reads the tables back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.netpolicy_node import POLICY_NETWORK_KEY, table_name
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment
from cnidra.datapath import netpolicy
from cnidra.nri.netpolicy import KINDS, PolicyEnforcer
from cnidra.state.layout import StateLayout
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State
from tests.datapath.policylab import IFNAME, Lab, lab

pytestmark = pytest.mark.netns

NET = "tenant-a/blue"
LABELS = {"a": {"app": "db"}, "b": {"app": "web"}}


def record(lab_: Lab, name: str) -> SandboxRecord:
    claim = ObjectRef("tenant-a", f"claim-{name}", f"uid-{name}")
    att = Attachment(
        claim,
        "net",
        IFNAME,
        {"cniVersion": "1.0.0", "name": "blue", "plugins": [{"type": "macvlan"}]},
        "node",
        "eth1",
        policy_network=NET,
    )
    result = {"cniVersion": "1.0.0", "ips": [{"address": f"{lab_.addresses[name]}/24"}]}
    pod = ObjectRef("tenant-a", name, f"pod-{name}")
    return SandboxRecord(
        f"sb-{name}", pod, str(lab_.pods[name]), State.ADDED, (Attached(att, result),)
    )


def pod_object(lab_: Lab, name: str) -> dict[str, Any]:
    status = [
        {"name": NET, "interface": IFNAME, "ips": [lab_.addresses[name]], POLICY_NETWORK_KEY: NET}
    ]
    return {
        "metadata": {
            "namespace": "tenant-a",
            "name": name,
            "labels": LABELS[name],
            "annotations": {"k8s.v1.cni.cncf.io/network-status": json.dumps(status)},
        },
        "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
    }


def allow_from(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1beta1",
        "kind": "MultiNetworkPolicy",
        "metadata": {
            "namespace": "tenant-a",
            "name": "db",
            "annotations": {"k8s.v1.cni.cncf.io/policy-for": NET},
        },
        "spec": {
            "podSelector": {"matchLabels": {"app": "db"}},
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": labels}}], "ports": [{"port": "http"}]}
            ],
        },
    }


def sync(enforcer: PolicyEnforcer, lab_: Lab, policy: dict[str, Any]) -> None:
    objects = {
        "MultiNetworkPolicy": [policy],
        "Namespace": [{"metadata": {"name": "tenant-a", "labels": {"team": "a"}}}],
        "Pod": [pod_object(lab_, n) for n in lab_.pods],
    }
    for kind in KINDS:
        enforcer.replace(kind, objects.get(kind, []))


async def test_the_reconciler_enforces_through_the_real_datapath(tmp_path: Path) -> None:
    with lab(("a", "b")) as lab_:
        store = SandboxStore(StateLayout(tmp_path))
        enforcer = PolicyEnforcer(store, settle=0.0)
        a, b = record(lab_, "a"), record(lab_, "b")
        for r in (a, b):
            store.put_blocking(r)
        # not synced: a's interface gets a default deny at attach
        await enforcer.at_add(a, LABELS["a"], a.attachments[0].attachment, None)
        assert lab_.probes([("b", "a", "tcp", 8080), ("a", "b", "tcp", 8080)]) == [False, False]
        # synced: only web pods reach a's http port; b (web) does, on 8080 only
        sync(enforcer, lab_, allow_from({"app": "web"}))
        await enforcer.at_add(b, LABELS["b"], b.attachments[0].attachment, None)
        enforcer.attached(a)
        enforcer.attached(b)
        await enforcer.apply_dirty()
        assert lab_.probes(
            [("b", "a", "tcp", 8080), ("b", "a", "tcp", 5432), ("a", "b", "tcp", 8080)]
        ) == [True, False, True]
        # the policy edited: web no longer allowed
        enforcer.changed("MultiNetworkPolicy", "MODIFIED", allow_from({"app": "other"}))
        await enforcer.apply_dirty()
        assert lab_.probes([("b", "a", "tcp", 8080), ("a", "b", "tcp", 8080)]) == [False, True]
        counted = netpolicy.counters(lab_.pods["a"], table_name(NET))
        assert any(c.verdict == "drop" and c.packets > 0 for c in counted)
        # a restart: the records say what is attached; the tables are read back and rewritten
        again = PolicyEnforcer(store, settle=0.0)
        again.restore()
        sync(again, lab_, allow_from({"app": "web"}))
        await again.apply_dirty()
        assert lab_.probes([("b", "a", "tcp", 8080), ("b", "a", "tcp", 5432)]) == [True, False]
        assert again.describe(("tenant-a", "a"))[IFNAME]["policies"] == ["tenant-a/db"]
        # an unplug removes the network's table: open again
        await again.detached(a, [a.attachments[0].attachment])
        assert not netpolicy.exists(lab_.pods["a"], table_name(NET))
        assert lab_.probe("b", "a", "tcp", 5432)
