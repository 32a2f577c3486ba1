"""What a tenant's claim may ask, checked offline exactly as prepare and the webhook check it:
one case per attack a claim could try on the root driver, against the shipped default
DeviceClass (and a few admin classes of the tests' own)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from cnidra.api.validate import validate_documents

ROOT = Path(__file__).parents[2]
DRIVER = "cni.dra.networking.x-k8s.io"
DEFAULT_CLASSES = [
    d for d in yaml.safe_load_all((ROOT / "deploy" / "deviceclass.yaml").read_text()) if d
]


def claim(
    params: dict[str, Any], device_class: str = "cni.networking.x-k8s.io", ns: str = "team-a"
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": ns},
        "spec": {
            "devices": {
                "requests": [{"name": "net", "exactly": {"deviceClassName": device_class}}],
                "config": [
                    {
                        "requests": ["net"],
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": {
                                "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                                "kind": "CNIConfig",
                                **params,
                            },
                        },
                    }
                ],
            }
        },
    }


def network(*plugins: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "ifName": "net1",
        "config": {"cniVersion": "1.1.0", "name": "n", "plugins": list(plugins)},
        **extra,
    }


MACVLAN = {
    "type": "macvlan",
    "ipam": {"type": "static", "addresses": [{"address": "198.18.1.5/24"}]},
}


def errors(
    doc: dict[str, Any], classes: list[dict[str, Any]] | None = None, **labels: str
) -> list[str]:
    [report] = validate_documents([doc], DEFAULT_CLASSES + (classes or []), labels)
    return [f"{i.path}: {i.message}" for i in report.issues.errors]


def test_a_claim_within_the_default_policy_is_valid() -> None:
    assert errors(claim(network(MACVLAN, {"type": "tuning", "mtu": 1400}))) == []


ATTACKS: list[tuple[str, dict[str, Any], str]] = [
    (
        "move the node's uplink into the pod",
        network({"type": "host-device", "device": "eth0"}),
        "plugins[0].type: plugin 'host-device' is not allowed for claims of this DeviceClass",
    ),
    (
        "replace the address of a host bridge",
        network({"type": "bridge", "bridge": "br0", "forceAddress": True, "isGateway": True}),
        "plugins[0].forceAddress: never claim-settable: replaces the host bridge's address",
    ),
    (
        "add host routes and addresses",
        network({"type": "bridge", "isGateway": True}),
        "plugins[0].isGateway: never claim-settable: adds addresses and routes on the host",
    ),
    (
        "promiscuous host bridge and host nftables rules",
        network({"type": "bridge", "promiscMode": True, "macspoofchk": True}),
        "plugins[0].macspoofchk: never claim-settable: adds nftables rules on the host",
    ),
    (
        "host IFB devices through bandwidth",
        network(MACVLAN, {"type": "bandwidth", "ingressRate": 1, "ingressBurst": 1}),
        "plugins[1].type: plugin 'bandwidth' is not allowed",
    ),
    (
        "masquerade through the node",
        network({"type": "bridge", "ipMasq": True}),
        "plugins[0].ipMasq: never claim-settable: adds NAT rules on the host",
    ),
    (
        "point-to-point with host routes",
        network({"type": "ptp", "ipMasq": True}),
        "plugins[0].type: plugin 'ptp' is not allowed",
    ),
    (
        "DNAT kubelet's port through portmap's runtimeConfig",
        network(
            MACVLAN,
            {
                "type": "portmap",
                "runtimeConfig": {"portMappings": [{"hostPort": 10250, "containerPort": 80}]},
            },
        ),
        "plugins[1].runtimeConfig: never claim-settable",
    ),
    (
        "port mappings as a capability",
        network(MACVLAN, capabilities={"portMappings": [{"hostPort": 10250, "containerPort": 80}]}),
        "capabilities.portMappings: never claim-settable: DNATs node ports",
    ),
    (
        "host-local writes wherever the claim says",
        network(
            {
                **MACVLAN,
                "ipam": {"type": "host-local", "dataDir": "/etc", "subnet": "198.18.1.0/24"},
            }
        ),
        "ipam.dataDir: never claim-settable: a host path the root driver writes",
    ),
    (
        "tuning writes wherever the claim says",
        network(MACVLAN, {"type": "tuning", "dataDir": "/etc/kubernetes"}),
        "plugins[1].dataDir: never claim-settable: a host path the root driver writes",
    ),
    (
        "dhcp connects to any socket",
        network(
            {
                "type": "macvlan",
                "ipam": {"type": "dhcp", "daemonSocketPath": "/run/containerd/containerd.sock"},
            }
        ),
        "ipam.daemonSocketPath: never claim-settable: a host socket the root driver connects to",
    ),
    (
        "pretend to be a pod of kube-system",
        network(MACVLAN, args={"K8S_POD_NAMESPACE": "kube-system"}),
        "args.K8S_POD_NAMESPACE: K8S_POD_NAMESPACE is a CNI_ARG the driver sets",
    ),
    (
        "configure the pod's loopback",
        {**network(MACVLAN), "ifName": "lo"},
        "ifName: 'lo' is the pod's loopback",
    ),
    (
        "hand the pod addresses of the node's own network",
        network({**MACVLAN, "ipam": {"type": "static", "addresses": [{"address": "10.0.0.5/24"}]}}),
        "addresses[0].address: 10.0.0.5/24 is outside the ranges this DeviceClass allows",
    ),
    (
        "an unknown plugin",
        network({"type": "evil"}),
        "plugins[0].type: plugin 'evil' is not allowed",
    ),
    (
        "bring its own policy",
        {"kind": "CNIPolicy", "claims": {"defineNetworks": True, "plugins": ["host-device"]}},
        "a CNIPolicy comes from a DeviceClass, not a claim",
    ),
]


def ranged(classes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The default class, with IP ranges and VLAN IDs in its policy."""
    out = copy.deepcopy(classes)
    rules = out[0]["spec"]["config"][0]["opaque"]["parameters"]["claims"]
    rules.update(ipRanges=["198.18.0.0/15"], vlanIDs=["100-199"])
    return out


@pytest.mark.parametrize("attack,params,expected", ATTACKS, ids=[a for a, _, _ in ATTACKS])
def test_every_attack_is_refused_with_the_field_named(
    attack: str, params: dict[str, Any], expected: str
) -> None:
    [report] = validate_documents([claim(params)], ranged(DEFAULT_CLASSES), {})
    found = [f"{i.path}: {i.message}" for i in report.issues.errors]
    assert any(expected in e for e in found), found


def test_vlan_ids_outside_the_policy_are_refused() -> None:
    vlan = network({"type": "vlan", "vlanId": 4000, "ipam": {"type": "static"}})
    [report] = validate_documents([claim(vlan)], ranged(DEFAULT_CLASSES), {})
    assert any(
        "VLAN 4000 is not allowed; allowed: 100-199" in i.message for i in report.issues.errors
    )


ADMIN_NETWORK = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "data"},
    "spec": {
        "config": [
            {
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {
                        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                        "kind": "CNIConfig",
                        "config": {"cniVersion": "1.1.0", "name": "data", "plugins": [MACVLAN]},
                    },
                }
            }
        ]
    },
}


BARE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "bare"},
    "spec": {},
}


def test_without_a_policy_a_claim_sets_only_its_interface_name() -> None:
    assert errors(claim({"ifName": "net1"}, "data"), [ADMIN_NETWORK]) == []
    found = errors(claim(network(MACVLAN), "bare"), [BARE])
    assert any(
        "config: a claim may not define its network with this DeviceClass" in e
        and "the DeviceClass has no CNIPolicy" in e
        for e in found
    ), found
    found = errors(claim({"ifName": "net1", "args": {"A": "1"}}, "data"), [ADMIN_NETWORK])
    assert any("args.A: a claim may not set this" in e for e in found), found


def test_a_claim_cannot_remove_what_the_class_pinned() -> None:
    nulled = claim({"ifName": "net1", "config": {"plugins": None}}, "data")
    found = errors(nulled, [ADMIN_NETWORK])
    assert any("config.plugins: is set by the DeviceClass" in e for e in found), found


def test_a_namespace_selector_limits_whom_the_policy_opens_for() -> None:
    scoped = copy.deepcopy(DEFAULT_CLASSES)
    scoped[0]["spec"]["config"][0]["opaque"]["parameters"]["namespaceSelector"] = {
        "matchLabels": {"networks": "self-service"}
    }
    doc = claim(network(MACVLAN))
    [report] = validate_documents([doc], scoped, {"networks": "self-service"})
    assert not report.issues.errors
    [report] = validate_documents([doc], scoped, {})
    assert any("does not cover namespace team-a" in i.message for i in report.issues.errors)


def test_field_names_are_matched_as_the_plugins_match_them() -> None:
    """Go reads IsGateway as isGateway and MTU as mtu: neither spelling gets around a rule (a
    tenant must write a field exactly as the plugin names it)."""
    found = errors(claim(network({"type": "bridge", "IsGateway": True})))
    assert any("plugins[0].IsGateway: is spelled differently" in e for e in found), found
    pinned = copy.deepcopy(ADMIN_NETWORK)
    pinned["metadata"]["name"] = "pinned"
    pinned["spec"]["config"][0]["opaque"]["parameters"]["config"] = {
        "cniVersion": "1.1.0",
        "name": "data",
        "type": "macvlan",
        "mtu": 1500,
    }
    pinned["spec"]["config"].append(
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                    "kind": "CNIPolicy",
                    "claims": {"defineNetworks": True, "plugins": ["macvlan"]},
                },
            }
        }
    )
    found = errors(claim({"ifName": "net1", "config": {"MTU": 9000}}, "pinned"), [pinned])
    assert any("config.MTU: is set by the DeviceClass" in e for e in found), found
