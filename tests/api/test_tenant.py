"""The tenant boundary, read as the plugins read it: each class of hostile claim from issue 22
(a JSON-string config, keys Go folds, a second spelling, fields the old policy never read,
host files and link-exclusive modes, unbounded strings), refused by the one verdict
`cnidra validate --policy`, the webhook and prepare share, in both the object and the string
form. The differential test against the plugins' own Go decoders is tests/cni/test_decoders.py."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from cnidra.api.issues import FieldPath, Issues
from cnidra.api.tenant import ambiguities, decode_network
from tests.api.helpers import cni_policy, device_class
from tests.api.test_policy import DRIVER, MACVLAN, claim, errors

RESTRICTED = device_class(
    "restricted",
    cni_policy(
        defineNetworks=True,
        plugins=["macvlan", "bridge", "vlan", "host-local", "static"],
        fields=["args", "capabilities"],
        ipRanges=["198.18.0.0/16"],
        vlanIDs=["100-199"],
    ),
)


def conflist(*plugins: dict[str, Any]) -> dict[str, Any]:
    return {"cniVersion": "1.1.0", "name": "n", "plugins": list(plugins)}


def both_forms(config: dict[str, Any], **extra: Any) -> list[dict[str, Any]]:
    """The claim's parameters with config as an object and as a JSON string."""
    return [
        {"ifName": "net1", "config": config, **extra},
        {"ifName": "net1", "config": json.dumps(config, ensure_ascii=False), **extra},
    ]


def refused(params: dict[str, Any], where: str, message: str, cls: str = "") -> None:
    found = errors(claim(params, "restricted"), [RESTRICTED]) if cls else errors(claim(params))
    assert any(where in e and message in e for e in found), found


STATIC = {"type": "static", "addresses": [{"address": "198.18.1.10/24"}]}
BRIDGE = {"type": "bridge", "bridge": "br-data"}

# (what the tenant wants, the config, the path refused, the message)
DEFAULT_CLASS: list[tuple[str, dict[str, Any], str, str]] = [
    # 1. the string form meets the same policy as the object form
    (
        "ptp with NAT",
        conflist({"type": "ptp", "ipMasq": True, "ipam": STATIC}),
        "plugins[0].type",
        "plugin 'ptp' is not allowed",
    ),
    (
        "portmap DNATing kubelet's port",
        conflist(
            {"type": "macvlan", "ipam": STATIC},
            {
                "type": "portmap",
                "runtimeConfig": {"portMappings": [{"hostPort": 10250, "containerPort": 80}]},
            },
        ),
        "plugins[1].runtimeConfig",
        "never claim-settable",
    ),
    (
        "host-device taking a data NIC",
        conflist({"type": "host-device", "device": "eth9"}),
        "plugins[0].type",
        "plugin 'host-device' is not allowed",
    ),
    (
        "bandwidth making an IFB on the host",
        conflist(MACVLAN, {"type": "bandwidth", "ingressRate": 1, "ingressBurst": 1}),
        "plugins[1].type",
        "plugin 'bandwidth' is not allowed",
    ),
    # 2. keys Go folds onto another field
    (
        "isGateway with a long s",
        conflist({**BRIDGE, "i\u017fGateway": True, "ipam": STATIC}),
        "plugins[0]",
        "keys must be ASCII",
    ),
    ("ipMasq with a long s", conflist({**BRIDGE, "ipMa\u017fq": True}), "plugins[0]", "ASCII"),
    (
        "forceAddress with long s",
        conflist({**BRIDGE, "forceAddre\u017f\u017f": True}),
        "plugins[0]",
        "ASCII",
    ),
    ("promiscMode", conflist({**BRIDGE, "promi\u017fcMode": True}), "plugins[0]", "ASCII"),
    (
        "dhcp socket with a long s",
        conflist({**BRIDGE, "ipam": {"type": "dhcp", "daemon\u017focketPath": "/run/x"}}),
        "plugins[0].ipam",
        "ASCII",
    ),
    ("prevResult", conflist({**BRIDGE, "prevRe\u017fult": {}}), "plugins[0]", "ASCII"),
    ("Kelvin sign", conflist({**BRIDGE, "\u212aey": 1}), "plugins[0]", "ASCII"),
    # 3. a second spelling of a field that was checked
    (
        "IPAM type overridden by Type",
        conflist({**BRIDGE, "ipam": {**STATIC, "Type": "host-local", "dataDir": "/anywhere"}}),
        "plugins[0].ipam.Type",
        "same field as 'type'",
    ),
    (
        "IPAM type as TYPE alone",
        conflist({**BRIDGE, "ipam": {"TYPE": "portmap"}}),
        "plugins[0].ipam.TYPE",
        "write 'type'",
    ),
    (
        "a plugin's Name",
        conflist({**BRIDGE, "Name": "cnidra-ns.team-b.blue", "ipam": STATIC}),
        "plugins[0].Name",
        "write 'name'",
    ),
    (
        "IsGateway in another case",
        conflist({**BRIDGE, "IsGateway": True}),
        "plugins[0].IsGateway",
        "write 'isGateway'",
    ),
    (
        "Ranges beside ranges",
        conflist(
            {
                **BRIDGE,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "198.18.1.0/24"}]],
                    "Ranges": [[{"subnet": "10.50.0.0/16"}]],
                },
            }
        ),
        "plugins[0].ipam.Ranges",
        "same field as 'ranges'",
    ),
    (
        "a conflist header in another case",
        {**conflist(MACVLAN), "Plugins": []},
        "config.Plugins",
        "write 'plugins'",
    ),
    # 8. host files and link-exclusive modes
    (
        "host-local reads a host file into the status",
        conflist(
            {
                **BRIDGE,
                "ipam": {
                    "type": "host-local",
                    "subnet": "198.18.1.0/24",
                    "resolvConf": "/etc/shadow",
                },
            }
        ),
        "plugins[0].ipam.resolvConf",
        "never claim-settable: a host file",
    ),
    (
        "macvlan passthru locks the parent",
        conflist({"type": "macvlan", "mode": "passthru", "ipam": STATIC}),
        "plugins[0].mode",
        "claims.exclusiveLinkModes",
    ),
    (
        "a field cnidra does not know",
        conflist({**BRIDGE, "kernelpath": "/sys/x", "ipam": STATIC}),
        "plugins[0].kernelpath",
        "not a field cnidra knows for bridge",
    ),
    (
        "a fraction where the plugin reads an integer",
        conflist({"type": "vlan", "vlanId": 100.0, "ipam": STATIC}),
        "plugins[0].vlanId",
        "not an integer",
    ),
]


@pytest.mark.parametrize(("what", "config", "where", "message"), DEFAULT_CLASS)
def test_the_default_class_refuses(
    what: str, config: dict[str, Any], where: str, message: str
) -> None:
    for params in both_forms(config):
        refused(params, where, message)


RESTRICTED_CLASS: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "an address through args.cni.ips",
        {
            "ifName": "net1",
            "config": conflist(
                {
                    "type": "macvlan",
                    "args": {"cni": {"ips": ["10.50.0.9/16"]}},
                    "ipam": {"type": "static", "addresses": [{"address": "198.18.1.10/24"}]},
                }
            ),
        },
        "plugins[0].args.cni.ips[0]",
        "outside the ranges",
    ),
    (
        "an address through CNI_ARGS IP",
        {
            "ifName": "net1",
            "args": {"IP": "198.18.1.9,10.50.0.9"},
            "config": conflist({"type": "macvlan", "ipam": MACVLAN["ipam"]}),
        },
        "args.IP",
        "10.50.0.9 is outside the ranges",
    ),
    (
        "an address through capabilities.ips",
        {
            "ifName": "net1",
            "capabilities": {"ips": ["10.50.0.9/16"]},
            "config": conflist(
                {"type": "macvlan", "capabilities": {"ips": True}, "ipam": {"type": "static"}}
            ),
        },
        "capabilities.ips",
        "10.50.0.9/16 is outside the ranges",
    ),
    (
        "an IPv4-mapped address",
        {
            "ifName": "net1",
            "config": conflist(
                {
                    "type": "macvlan",
                    "ipam": {"type": "static", "addresses": [{"address": "::ffff:10.50.0.9/120"}]},
                }
            ),
        },
        "addresses[0].address",
        "outside the ranges",
    ),
    (
        "a static gateway outside",
        {
            "ifName": "net1",
            "config": conflist(
                {
                    "type": "macvlan",
                    "ipam": {
                        "type": "static",
                        "addresses": [{"address": "198.18.1.10/24", "gateway": "10.50.0.1"}],
                    },
                }
            ),
        },
        "addresses[0].gateway",
        "outside the ranges",
    ),
    (
        "a bridge port VLAN",
        {"ifName": "net1", "config": conflist({**BRIDGE, "vlan": 4000, "ipam": STATIC})},
        "plugins[0].vlan",
        "VLAN 4000 is not allowed",
    ),
    (
        "a bridge trunk wider than the allowed IDs",
        {
            "ifName": "net1",
            "config": conflist(
                {**BRIDGE, "vlanTrunk": [{"minID": 150, "maxID": 300}], "ipam": STATIC}
            ),
        },
        "plugins[0].vlanTrunk[0].minID",
        "VLAN 150-300 is not allowed",
    ),
    (
        "VLANID beside vlanId",
        {
            "ifName": "net1",
            "config": conflist({"type": "vlan", "vlanId": 100, "VLANID": 4000, "ipam": STATIC}),
        },
        "plugins[0].VLANID",
        "same field as 'vlanId'",
    ),
]


@pytest.mark.parametrize(("what", "params", "where", "message"), RESTRICTED_CLASS)
def test_a_class_with_ranges_and_vlans_refuses(
    what: str, params: dict[str, Any], where: str, message: str
) -> None:
    refused(params, where, message, cls="restricted")
    if isinstance(params.get("config"), dict):
        as_string = {**params, "config": json.dumps(params["config"])}
        refused(as_string, where, message, cls="restricted")


def test_what_the_restricted_class_allows_passes() -> None:
    ok = {
        "ifName": "net1",
        "args": {"IP": "198.18.1.9"},
        "config": conflist(
            {
                **BRIDGE,
                "vlan": 120,
                "vlanTrunk": [{"minID": 100, "maxID": 199}],
                "isGateway": False,
            }
        ),
    }
    assert errors(claim(ok, "restricted"), [RESTRICTED]) == []
    # with the tenant's own static addresses, CNI_ARGS IP would replace them: refused
    ok["config"]["plugins"][0]["ipam"] = MACVLAN["ipam"]
    found = errors(claim(ok, "restricted"), [RESTRICTED])
    assert len(found) == 1 and "args.IP: would replace the static addresses" in found[0]


def test_zero_values_of_dangerous_fields_are_what_leaving_them_out_is() -> None:
    config = conflist({**BRIDGE, "isGateway": False, "ipMasq": False, "ipam": STATIC})
    for params in both_forms(config):
        assert errors(claim(params)) == []


def test_admin_fields_pass_as_written() -> None:
    """A field the DeviceClass writes, even one cnidra does not know, is the admin's."""
    admin = copy.deepcopy(RESTRICTED)
    admin["metadata"]["name"] = "admin-bridge"
    admin["spec"]["config"].append(
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                    "kind": "CNIConfig",
                    "config": {
                        "cniVersion": "1.1.0",
                        "name": "n",
                        "type": "bridge",
                        "isGateway": True,
                        "futureField": 1,
                    },
                },
            }
        }
    )
    params = {"ifName": "net1", "config": {"ipam": MACVLAN["ipam"]}}
    assert errors(claim(params, "admin-bridge"), [admin]) == []
    sneaky = {"ifName": "net1", "config": {"ipam": MACVLAN["ipam"], "otherField": 1}}
    found = errors(claim(sneaky, "admin-bridge"), [admin])
    assert any("config.otherField: is not a field cnidra knows" in e for e in found), found


def test_opened_fields_pass() -> None:
    opened = copy.deepcopy(RESTRICTED)
    opened["metadata"]["name"] = "opened"
    rules = opened["spec"]["config"][0]["opaque"]["parameters"]["claims"]
    rules["plugins"].append("sriov")
    rules["pluginFields"] = {"sriov": ["vlan", "spoofchk"]}
    params = {
        "ifName": "net1",
        "config": conflist({"type": "sriov", "vlan": 100, "spoofchk": "on", "ipam": STATIC}),
    }
    assert errors(claim(params, "opened"), [opened]) == []
    params["config"]["plugins"][0]["trust"] = "on"
    found = errors(claim(params, "opened"), [opened])
    assert any("plugins[0].trust: is not a field cnidra knows for sriov" in e for e in found)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 10_000 + "]" * 10_000,
        '{"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "mtu": ' + "9" * 5000 + "}",
        '{"a": 1, "a": 2}',
        '{"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "mtu": NaN}',
        "x" * 70_000,
    ],
    ids=["deep", "long-number", "duplicate", "nan", "huge"],
)
def test_unbounded_string_configs_are_refused_with_the_field_named(text: str) -> None:
    found = errors(claim({"ifName": "net1", "config": text}))
    assert any("opaque.parameters" in e for e in found), found


def test_ambiguities_are_found_anywhere_and_lone_surrogates_refused() -> None:
    issues = Issues()
    ambiguities({"a": [{"b": "\ud800", "c": 1, "C": 2}], "n": 2**64}, FieldPath(), issues)
    messages = sorted(str(i) for i in issues.errors)
    assert any("surrogate" in m for m in messages)
    assert any("a[0].C: is the same field as 'c'" in m for m in messages)
    assert any("does not fit a 64-bit integer" in m for m in messages)


def test_the_decoded_form_is_the_config_unchanged() -> None:
    config = conflist({**BRIDGE, "ipam": STATIC}, {"type": "tuning", "mtu": 1400})
    issues = Issues()
    network = decode_network(config, FieldPath(), issues)
    assert network.valid and network.config is config and not issues.errors
    assert [p.type for p in network.plugins] == ["bridge", "tuning"]
    assert [a.text for a in network.addresses()] == ["198.18.1.10/24"]


# Found by a hostile-tenant review of this decoder (each was allowed before its fix).
def test_python_field_names_are_not_a_second_spelling() -> None:
    """pydantic accepted `port_mappings` beside the alias `portMappings`, and the rule that
    refuses port mappings looked for the alias only."""
    params = {
        "ifName": "net1",
        "capabilities": {"port_mappings": [{"hostPort": 10250, "containerPort": 80}]},
        "config": conflist({"type": "macvlan", "capabilities": {"portMappings": True},
                            "ipam": STATIC}),
    }  # fmt: skip
    refused(params, "capabilities.port_mappings", "unknown field", cls="restricted")
    refused({"if_name": "net1", "config": conflist(MACVLAN)}, "if_name", "unknown field")


@pytest.mark.parametrize(
    "tuning",
    [{"type": "tuning", "promisc": True}, {"type": "tuning", "allmulti": True},
     {"type": "tuning", "args": {"cni": {"promisc": True}}}],
)  # fmt: skip
def test_a_macvlan_child_cannot_make_its_host_parent_promiscuous(tuning: dict[str, Any]) -> None:
    for params in both_forms(conflist({"type": "macvlan", "ipam": STATIC}, tuning)):
        refused(params, "plugins[1]", "never claim-settable")


@pytest.mark.parametrize(
    ("bridge", "where"),
    [({"vlanTrunk": [{"minID": 100, "maxID": 199}]}, "plugins[0].vlan"),
     ({"vlan": 150, "preserveDefaultVlan": True}, "plugins[0].preserveDefaultVlan"),
     ({}, "plugins[0].vlan")],
)  # fmt: skip
def test_the_bridges_implicit_vlan_1_is_judged(bridge: dict[str, Any], where: str) -> None:
    """A trunk without an access VLAN makes VLAN 1 native; preserveDefaultVlan keeps it; a port
    with no VLAN is on the bridge's default VLAN 1."""
    params = {"ifName": "net1", "config": conflist({**BRIDGE, **bridge, "ipam": STATIC})}
    refused(params, where, "VLAN 1 is not allowed", cls="restricted")


POOL_CLASS = copy.deepcopy(RESTRICTED)
POOL_CLASS["metadata"]["name"] = "pool"
_rules = POOL_CLASS["spec"]["config"][0]["opaque"]["parameters"]["claims"]
_rules["plugins"].append("cnidra")
_rules.pop("ipRanges")


@pytest.mark.parametrize(
    ("extra", "plugin_extra", "where"),
    [({"args": {"IP": "10.96.0.10"}}, {}, "args.IP"),
     ({"capabilities": {"ips": ["10.96.0.10/12"]}}, {"capabilities": {"ips": True}},
      "capabilities.ips"),
     ({}, {"args": {"cni": {"ips": ["10.96.0.10/12"]}}}, "args.cni.ips")],
)  # fmt: skip
def test_cnidra_ipam_addresses_are_the_pools_only(
    extra: dict[str, Any], plugin_extra: dict[str, Any], where: str
) -> None:
    plugin = {"type": "macvlan", "ipam": {"type": "cnidra", "pool": "data-a"}, **plugin_extra}
    params = {"ifName": "net1", "config": conflist(plugin), **extra}
    found = errors(claim(params, "pool"), [POOL_CLASS])
    assert any(where in e and "from the pool only" in e for e in found), found


@pytest.mark.parametrize("params", [
    {"ifName": "net1", "config": conflist({**BRIDGE, "vlanTrunk": 5, "ipam": STATIC})},
    {"ifName": "net1", "config": conflist({**BRIDGE, "vlanTrunk": True, "ipam": STATIC})},
    {"ifName": "net1", "config": None},
])  # fmt: skip
def test_malformed_configs_are_errors_not_exceptions(params: dict[str, Any]) -> None:
    assert errors(claim(params)), "refused with the field named"
