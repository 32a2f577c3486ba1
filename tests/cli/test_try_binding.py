"""`cnidra try` plans what it runs by prepare's own path (`resolve_attachment`): the attachment
is prepare's but for the names try owns, every field the class's CNIPolicy decides (the rate
limit among them) and the host-side judgement against the machine's links included; a class
not given leaves only its CNIPolicy unjudged (no root: the plan, not the run)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from cnidra.api.bandwidth import Rate
from cnidra.api.hostside import LinkFacts, NodeFacts
from cnidra.api.issues import Issues
from cnidra.api.refs import ObjectRef
from cnidra.api.validate import validate_documents
from cnidra.cli.try_ import HOST_LAYOUT, Refused, plan_attachments
from cnidra.dra.resolve import Device, resolve_attachment

ROOT = Path(__file__).parents[2]


def documents(bandwidth: dict[str, Any] | None) -> tuple[list[Any], list[Any]]:
    classes = list(yaml.safe_load_all((ROOT / "deploy" / "deviceclass.yaml").read_text()))
    classes = [copy.deepcopy(c) for c in classes if c]
    if bandwidth is not None:
        params = classes[0]["spec"]["config"][0]["opaque"]["parameters"]
        assert params["kind"] == "CNIPolicy"
        params["bandwidth"] = bandwidth
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / "macvlan-claim.yaml").read_text())]
    return classes, [d for d in docs if d]


def test_try_takes_the_policys_rate_as_prepare_does() -> None:
    classes, docs = documents({"whenUnreserved": "100M"})
    reports = validate_documents(docs, classes, {})
    [attachment] = plan_attachments(
        reports, "pool", documents=docs, policy_documents=classes, namespace_labels={}
    )
    assert attachment.rate == Rate(100 * 10**6, 100 * 10**6)
    [resolved] = [r for report in reports for r in report.resolved]
    verdict = resolve_attachment(
        resolved.judged,
        resolved.request,
        ObjectRef("default", "macvlan-data", ""),
        Device("pool", attachment.parent, link=attachment.parent),
        HOST_LAYOUT.private_dirs(),
        Issues(),
        resolved.where,
        namespace_labels={},
    )
    assert verdict is not None
    # prepare's attachment but for what try names as its own (its claim, namespace and
    # directories) and the addresses try hands out locally from the pool in the input
    for name in (
        "node_link_allowed",
        "tenant_pool",
        "pool_ranges",
        "tenant_static",
        "rate",
        "bandwidth",
        "policy_network",
        "if_name",
        "parent",
        "network_label",
    ):
        assert getattr(attachment, name) == getattr(verdict, name), name
    assert attachment.claim.namespace == "cnidra-try"  # fmt: skip


def test_without_a_policy_rate_try_runs_unlimited() -> None:
    classes, docs = documents(None)
    reports = validate_documents(docs, classes, {})
    [attachment] = plan_attachments(
        reports, "pool", documents=docs, policy_documents=classes, namespace_labels={}
    )
    assert attachment.rate is None


BRIDGE_CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "bridged", "namespace": "default"},
    "spec": {
        "devices": {
            "requests": [{"name": "br", "exactly": {"deviceClassName": "cni.networking.x-k8s.io"}}],
            "config": [
                {
                    "requests": ["br"],
                    "opaque": {
                        "driver": "cni.dra.networking.x-k8s.io",
                        "parameters": {
                            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                            "kind": "CNIConfig",
                            "ifName": "net1",
                            "config": {
                                "cniVersion": "1.0.0",
                                "name": "bridged",
                                "plugins": [
                                    {
                                        "type": "bridge",
                                        "bridge": "br-data",
                                        "mtu": 1400,
                                        "ipam": {
                                            "type": "static",
                                            "addresses": [{"address": "198.18.40.7/24"}],
                                        },
                                    }
                                ],
                            },
                        },
                    },
                }
            ],
        }
    },
}


def _plan(claim: dict[str, Any], node: NodeFacts | None, with_class: bool = True) -> Any:
    classes, _ = documents(None)
    docs = [claim]
    reports = validate_documents(docs, classes if with_class else [], {})
    return plan_attachments(
        reports,
        "pool",
        documents=docs,
        policy_documents=classes if with_class else [],
        namespace_labels={},
        node=node,
    )


def test_try_judges_the_host_side_as_prepare_does() -> None:
    """The lesson's bridge MTU: on a machine whose br-data is a 9000-byte bridge, a claim's
    mtu 1400 would shrink it, so try refuses it as prepare does; without the mtu, try runs it
    with the bridge's own MTU pinned. Without the machine's links (node None) nothing is
    judged of the host side (what `cnidra try` never passes: it reads them)."""
    node = NodeFacts({"br-data": LinkFacts("br-data", "bridge", 9000)})
    try:
        _plan(copy.deepcopy(BRIDGE_CLAIM), node)
    except Refused as exc:
        [problem] = exc.problems
        assert "1400 differs from bridge br-data's MTU 9000" in problem
    else:
        raise AssertionError("try ran what prepare refuses")
    claim = copy.deepcopy(BRIDGE_CLAIM)
    params = claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    del params["config"]["plugins"][0]["mtu"]
    [attachment] = _plan(claim, node)
    assert attachment.network["plugins"][0]["mtu"] == 9000  # pinned, as prepare pins it


def test_try_refuses_an_address_the_machine_holds() -> None:
    """A static address this machine holds is refused by try as prepare refuses one the node
    holds (docs/security.md, "Addresses are owned")."""
    claim = copy.deepcopy(BRIDGE_CLAIM)
    del claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["config"]["plugins"][0]["mtu"]
    node = NodeFacts({"eth9": LinkFacts("eth9", "physical", 1500, ("198.18.40.7/24",))})
    try:
        _plan(claim, node)
    except Refused as exc:
        assert any("198.18.40.7" in p for p in exc.problems), exc.problems
    else:
        raise AssertionError("try ran an address the machine holds")


def test_a_class_not_given_leaves_only_its_policy_unjudged() -> None:
    """Without the DeviceClass, try still takes prepare's path: the host side is judged, and
    the plan says the class's CNIPolicy was not (the report's warning)."""
    node = NodeFacts({"br-data": LinkFacts("br-data", "bridge", 9000)})
    try:
        _plan(copy.deepcopy(BRIDGE_CLAIM), node, with_class=False)
    except Refused as exc:
        assert "MTU 9000" in exc.problems[0]
    else:
        raise AssertionError("try ran what prepare refuses")
    claim = copy.deepcopy(BRIDGE_CLAIM)
    del claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["config"]["plugins"][0]["mtu"]
    reports = validate_documents([claim], [], {})
    assert any("its DeviceClass is not in the input" in i.message for r in reports
               for i in r.issues.warnings)  # fmt: skip
    [attachment] = plan_attachments(reports, "pool", documents=[claim], node=node)
    assert attachment.network["plugins"][0]["mtu"] == 9000
