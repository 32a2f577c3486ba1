"""`changed`, prepare's copy of an Attachment with some fields changed, is dataclasses.replace:
the same fields, equal, the parsed netconf not carried over, an unknown
field refused; and Attachment stays a class it is right for (no __post_init__, the parsed
netconf its one field __init__ does not take)."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

import pytest

from cnidra.api.bandwidth import Rate
from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment, changed


def attachment() -> Attachment:
    return Attachment(
        claim=ObjectRef("ns", "claim", "uid-1"),
        request="net",
        if_name="net1",
        network={"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "bridge"}]},
        pool="node",
        device="eth1",
        cni_args=(("A", "b"),),
        share_id="share",
        network_label="n",
        parent="eth1",
        pool_ranges=(ipaddress.ip_network("10.0.0.0/24"),),
    )


def every_field(a: Attachment) -> dict[str, Any]:
    return {f.name: getattr(a, f.name) for f in dataclasses.fields(Attachment)}


CHANGES: list[dict[str, Any]] = [
    {},
    {"if_name": "net9"},
    {"network": {"cniVersion": "1.0.0", "name": "m", "plugins": [{"type": "macvlan"}]}},
    {
        "node_link_allowed": True,
        "tenant_pool": True,
        "pool_ranges": None,
        "tenant_static": True,
        "rate": Rate(10**6, 10**6),
        "policy_network": "claim:ns/n",
    },
    {"claim": ObjectRef("ns", "other", "uid-2"), "share_id": None, "explicit_name": False},
]


@pytest.mark.parametrize("changes", CHANGES)
def test_changed_is_replace(changes: dict[str, Any]) -> None:
    old = attachment()
    assert old.netconf.name == "n"  # parsed: a copy must not carry it over
    ours, theirs = changed(old, **changes), dataclasses.replace(old, **changes)
    assert ours == theirs
    assert every_field(ours) == every_field(theirs)
    assert every_field(ours)["_netconf"] is None
    for name, value in changes.items():
        assert getattr(ours, name) is value
    assert ours.netconf.name == ours.network["name"]


def test_changed_refuses_what_is_no_field() -> None:
    with pytest.raises(TypeError, match="no field"):
        changed(attachment(), ifname="x")
    with pytest.raises(TypeError):
        changed(attachment(), _netconf=None)


def test_attachment_is_what_changed_assumes() -> None:
    assert not hasattr(Attachment, "__post_init__")
    assert [f.name for f in dataclasses.fields(Attachment) if not f.init] == ["_netconf"]
