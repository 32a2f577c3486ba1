"""Named networks (references to CNINetworks, node confs, NADs) and interface naming: pure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cnidra.api.convert import OutputKind, read_sources, to_document
from cnidra.api.issues import FieldPath, Issues
from cnidra.api.merge import ConfigEntry, Source
from cnidra.api.naming import NamingError, Slot, assign_names
from cnidra.api.networks import (
    NamedNetwork,
    NetworkRef,
    StaticCatalog,
    Unresolved,
    cninetwork,
    crd,
    nad,
    node_conf,
)
from cnidra.api.validate import check_request

ROOT = Path(__file__).resolve().parents[2]
MACVLAN = {
    "cniVersion": "1.0.0",
    "name": "blue-net",
    "type": "macvlan",
    "master": "eth1",
    "ipam": {"type": "static", "addresses": [{"address": "198.18.5.5/24"}]},
}
POLICY = {
    "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
    "kind": "CNIPolicy",
    "claims": {"defineNetworks": True, "plugins": ["macvlan", "static"]},
}


def nad_obj(name: str, namespace: str, config: dict[str, Any] | None) -> dict[str, Any]:
    spec = {"config": json.dumps(config)} if config is not None else {}
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def net_obj(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def entries(claim: dict[str, Any], policy: dict[str, Any] | None = POLICY) -> list[ConfigEntry]:
    base = {"apiVersion": "cni.networking.x-k8s.io/v1alpha1", "kind": "CNIConfig"}
    out = []
    if policy is not None:
        out.append(ConfigEntry(Source.CLASS, policy, (), FieldPath(("class",))))
    out.append(ConfigEntry(Source.CLAIM, {**base, **claim}, (), FieldPath(("claim",))))
    return out


def resolve(
    claim: dict[str, Any],
    catalog: StaticCatalog,
    namespace: str = "team-a",
    policy: dict[str, Any] | None = POLICY,
) -> tuple[Any, dict[str, str]]:
    issues = Issues()
    resolved = check_request(
        entries(claim, policy), "net", namespace, {}, issues, FieldPath(), catalog=catalog
    )
    return resolved, {str(i.path): i.message for i in issues.errors}


def catalog(*networks: NamedNetwork | Unresolved, keys: tuple[str, ...]) -> StaticCatalog:
    return StaticCatalog(dict(zip(keys, networks, strict=True)))


def test_a_reference_sets_exactly_one_kind() -> None:
    with pytest.raises(ValueError, match="exactly one of name"):
        NetworkRef.model_validate({"name": "a", "networkID": "b"})
    with pytest.raises(ValueError, match="not a NetworkID"):
        NetworkRef.model_validate({"networkID": "../etc/passwd"})
    ref = NetworkRef.model_validate({"attachmentDefinition": "team-b/blue"})
    assert ref.nad("team-a") == ("team-b", "blue")


def test_a_nad_of_the_claims_namespace_is_used_as_it_is_and_checked_as_the_claims() -> None:
    blue = nad(nad_obj("blue", "team-a", MACVLAN), trusted=False)
    cat = catalog(blue, keys=("NetworkAttachmentDefinition team-a/blue",))
    resolved, errors = resolve({"network": {"attachmentDefinition": "blue"}}, cat)
    assert not errors
    assert resolved.config.config["plugins"][0]["master"] == "eth1"
    assert resolved.network.status_name == "team-a/blue"
    # what the class's CNIPolicy does not allow, a NAD cannot bring in either
    masq = nad(nad_obj("masq", "team-a", {**MACVLAN, "type": "bridge", "ipMasq": True}), False)
    cat = catalog(masq, keys=("NetworkAttachmentDefinition team-a/masq",))
    resolved, errors = resolve({"network": {"attachmentDefinition": "masq"}}, cat)
    assert resolved is None
    where = '["NetworkAttachmentDefinition team-a/masq"].spec.config.plugins[0].ipMasq'
    assert "never claim-settable: adds NAT rules on the host" in errors[where]


def test_a_nad_of_another_namespace_needs_the_class_to_list_it() -> None:
    blue = nad(nad_obj("blue", "shared", MACVLAN), trusted=False)
    cat = catalog(blue, keys=("NetworkAttachmentDefinition shared/blue",))
    ref = {"network": {"attachmentDefinition": "shared/blue"}}
    _, errors = resolve(ref, cat)
    assert "claims.attachmentDefinitionNamespaces" in errors["claim.network.attachmentDefinition"]
    policy = {
        **POLICY,
        "claims": {**POLICY["claims"], "attachmentDefinitionNamespaces": ["shared"]},
    }
    resolved, errors = resolve(ref, cat, policy=policy)
    assert not errors and resolved is not None


def test_a_claim_may_not_name_a_node_conf() -> None:
    _, errors = resolve({"network": {"networkID": "10-primary"}}, StaticCatalog())
    assert "a claim may not name a node conf" in errors["claim.network.networkID"]


def test_a_cninetwork_is_the_admins_and_says_who_may_use_it() -> None:
    data = cninetwork(
        net_obj(
            "data",
            config={**MACVLAN, "name": "data"},
            namespaces=["team-a"],
            routes=[{"dst": "203.0.113.0/24", "gw": "198.18.5.1"}],
            ifNamePrefix="data",
        )
    )
    assert isinstance(data, NamedNetwork)
    cat = catalog(data, keys=("CNINetwork data",))
    # no CNIPolicy at all: a claim may still use an admin's network that admits its namespace
    resolved, errors = resolve({"network": {"name": "data"}}, cat, policy=None)
    assert not errors
    assert resolved.config.if_name_prefix == "data"
    assert resolved.config.config["plugins"][0]["ipam"]["routes"] == [
        {"dst": "203.0.113.0/24", "gw": "198.18.5.1"}
    ]
    _, errors = resolve({"network": {"name": "data"}}, cat, namespace="team-b", policy=None)
    assert "may be used from namespaces team-a, not team-b" in errors["claim.network"]
    # the admin's config is locked: a claim cannot patch it
    _, errors = resolve({"network": {"name": "data"}, "config": MACVLAN}, cat)
    assert "a request either embeds its network or references one" in errors["claim.network"]


def test_unusable_networks_say_what_is_wrong() -> None:
    only_resource = nad_obj("sriov", "team-a", None)
    only_resource["metadata"]["annotations"] = {"k8s.v1.cni.cncf.io/resourceName": "intel/vf"}
    found = nad(only_resource, trusted=False)
    assert isinstance(found, Unresolved)
    assert "names only the device resource 'intel/vf'" in found.message
    missing = node_conf("data", {}, "/etc/cni/net.d")
    assert isinstance(missing, Unresolved)
    assert "none of data.conflist, data.conf, data.json in /etc/cni/net.d" in missing.message
    bad_type = cninetwork(net_obj("x", type="sriov", config=MACVLAN))
    assert isinstance(bad_type, Unresolved) and "first plugin is 'macvlan'" in bad_type.message
    both = cninetwork(net_obj("x", config=MACVLAN, networkID="x"))
    assert isinstance(both, Unresolved) and "exactly one of config" in both.message
    _, errors = resolve({"network": {"name": "gone"}}, StaticCatalog())
    assert errors["claim.network"] == "CNINetwork gone was not found"


def test_a_node_conf_is_read_as_libcni_reads_it() -> None:
    conf = node_conf("data", {"data.conf": json.dumps(MACVLAN).encode()}, "/etc/cni/net.d")
    assert isinstance(conf, NamedNetwork)
    assert conf.config["plugins"][0]["type"] == "macvlan"
    broken = node_conf("data", {"data.conflist": b"{,}"}, "/etc/cni/net.d")
    assert isinstance(broken, Unresolved) and "unreadable" in broken.message


def test_names_explicit_first_then_prefixes_then_net_n() -> None:
    slots = [
        Slot("a"),
        Slot("b", explicit="net1"),
        Slot("c", prefix="data"),
        Slot("d"),
        Slot("e", prefix="data"),
    ]
    assert assign_names(slots) == ["net2", "net1", "data0", "net3", "data1"]
    assert assign_names([Slot("a")], taken={"net1": "other claim"}) == ["net2"]
    assert assign_names([Slot("a", preferred="net4")]) == ["net4"]
    with pytest.raises(NamingError) as err:
        assign_names([Slot("a", explicit="eth0"), Slot("b", explicit="x"), Slot("c", explicit="x")])
    assert [i for i, _ in err.value.problems] == [0, 2]
    assert "is the pod's own" in str(err.value) and "already used by b" in str(err.value)


@given(
    st.lists(
        st.one_of(
            st.builds(lambda n: Slot("s", explicit=f"if{n}"), st.integers(0, 30)),
            st.builds(lambda p: Slot("s", prefix=p), st.sampled_from(["data", "net", "x"])),
            st.just(Slot("s")),
        ),
        max_size=20,
    )
)
def test_names_are_unique_or_the_collision_is_said(slots: list[Slot]) -> None:
    try:
        names = assign_names(slots)
    except NamingError as exc:
        explicit = [s.explicit for s in slots if s.explicit]
        assert len(explicit) != len(set(explicit)) and exc.problems
        return
    assert len(names) == len(set(names)) == len(slots)
    for slot, name in zip(slots, names, strict=True):
        if slot.explicit:
            assert name == slot.explicit
        assert len(name) <= 15 and name not in ("eth0", "lo")


def test_the_chart_crd_is_the_one_the_code_defines() -> None:
    path = ROOT / "charts" / "cnidra" / "crds" / "cninetworks.cni.networking.x-k8s.io.yaml"
    assert yaml.safe_load(path.read_text()) == crd()
    assert path.read_text() in (ROOT / "deploy" / "crds.yaml").read_text()


def test_convert_a_nad_into_a_claim_that_references_it() -> None:
    text = yaml.safe_dump(
        {
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": "blue", "namespace": "team-a"},
            "spec": {"config": json.dumps(MACVLAN)},
        }
    )
    [source] = read_sources(text)
    doc = to_document(source, OutputKind.TEMPLATE, reference=True)
    devices = doc["spec"]["spec"]["devices"]
    params = devices["config"][0]["opaque"]["parameters"]
    assert params["network"] == {"attachmentDefinition": "blue"} and "config" not in params
    selector = devices["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
    assert selector.endswith('.ifName == "eth1"')
