"""The network a checkpointed attachment is on, as a policy's `policy-for` names it
(docs/network-policy.md), and checkpoints of before it still read."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from cnidra.api.networks import StaticCatalog, cninetwork, nad
from cnidra.api.nodes import NodeView
from cnidra.state.checkpoint import VERSION, Checkpoint, PreparedClaim
from cnidra.state.layout import StateLayout
from tests.dra.test_prepare import DIRS, DRIVER, REF, VIEW, claim, params


def with_class(c: dict[str, Any], name: str = "macvlan-a") -> dict[str, Any]:
    c = copy.deepcopy(c)
    c["spec"] = {"devices": {"requests": [{"name": "net", "exactly": {"deviceClassName": name}}]}}
    return c


def reference(**network: str) -> list[dict[str, Any]]:
    return [
        {
            "source": "FromClaim",
            "requests": ["net"],
            "opaque": {"driver": DRIVER, "parameters": params(config=None, network=network)},
        }
    ]


def one(c: dict[str, Any], **kwargs: Any) -> Any:
    from cnidra.dra.prepare import resolve_claim

    [dev] = resolve_claim(c, REF, "n1", DIRS, kwargs.pop("view", VIEW), **kwargs).devices
    return dev


def test_a_network_the_claim_defines_is_claim_namespace_and_config_name() -> None:
    assert one(with_class(claim())).policy_network == "claim:ns/n"


def test_a_class_network_is_the_deviceclass() -> None:
    configs = [
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": params(ifName=None)}},
        {
            "source": "FromClaim",
            "requests": ["net"],
            "opaque": {"driver": DRIVER, "parameters": params(config=None)},
        },
    ]
    assert one(with_class(claim(configs))).policy_network == "deviceclass:macvlan-a"
    # v1beta1's deviceClassName at the request's top level
    c = with_class(claim(configs))
    c["spec"]["devices"]["requests"][0] = {"name": "net", "deviceClassName": "old"}
    assert one(c).policy_network == "deviceclass:old"


def test_a_referenced_nad_or_cninetwork_is_named_as_policy_for_names_it() -> None:
    config = '{"cniVersion": "1.0.0", "plugins": [{"type": "macvlan", "master": "eth1"}]}'
    made = nad({"metadata": {"namespace": "ns", "name": "blue"}, "spec": {"config": config}}, False)
    known = StaticCatalog({"NetworkAttachmentDefinition ns/blue": made})
    dev = one(with_class(claim(reference(attachmentDefinition="blue"))), catalog=known)
    assert dev.policy_network == "ns/blue"
    network = cninetwork(
        {
            "metadata": {"name": "data-a"},
            "spec": {"config": {"cniVersion": "1.0.0", "plugins": [{"type": "bridge"}]}},
        }
    )
    results = [{"request": "net", "driver": DRIVER, "pool": "n1", "device": "net-data-a"}]
    view = NodeView(links={"net-data-a": "eth2"}, networks={"net-data-a": network})
    assert one(with_class(claim([], results)), view=view).policy_network == "cninetwork:data-a"


def test_the_checkpoint_keeps_it_and_reads_records_of_before(tmp_path: Path) -> None:
    layout = StateLayout(tmp_path)
    prepared = PreparedClaim(REF, ("pod-1",), (one(with_class(claim())),))
    data = prepared.to_json()
    assert data["version"] == VERSION == 5
    assert PreparedClaim.from_json(data).devices[0].policy_network == "claim:ns/n"
    old = copy.deepcopy(data)
    old["version"] = 3
    del old["devices"][0]["policy_network"]
    Checkpoint(layout)  # the directory
    (layout.claims / "uid-1.json").write_text(__import__("json").dumps(old))
    [loaded] = Checkpoint(layout).all()
    assert loaded.devices[0].policy_network == "claim:ns/n"  # its owned name says whose
    old["devices"][0]["status_name"] = "other/red"
    assert PreparedClaim.from_json(old).devices[0].policy_network == "other/red"
    old["devices"][0]["status_name"] = ""
    old["devices"][0]["network"] = {**old["devices"][0]["network"], "name": "cnidra-cluster.n"}
    assert PreparedClaim.from_json(old).devices[0].policy_network == ""
