from __future__ import annotations

import json

import pytest

from cnidra.api.issues import FieldPath, Issues
from cnidra.api.netconf import validate_network_config
from cnidra.api.validate import parse_parameters, validate_documents
from tests.api.helpers import claim, conflist, doc_errors, errors_of, params

MACVLAN = {
    "type": "macvlan",
    "master": "eth0",
    "mode": "bridge",
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.18.0.0/24"}]]},
}


def test_design_review_example_has_exactly_its_three_mistakes() -> None:
    bridge = {"type": "bridge", "master": "ens2f0np0", "hairpinMode": "yes-we-need!", "vlan": "110"}
    doc = claim()
    doc["spec"]["devices"]["config"] = [
        {
            "requests": ["net"],
            "opaque": {
                "driver": "cni.dra.networking.x-k8s.io",
                "parameters": params(conflist(bridge)),
            },
        }
    ]
    errors = doc_errors(doc)
    prefix = "spec.devices.config[0].opaque.parameters.config.plugins[0]"
    # the two values bridge would refuse are errors; the field bridge ignores is a warning
    assert set(errors) == {f"{prefix}.hairpinMode", f"{prefix}.vlan"}
    [report] = validate_documents([doc])
    [master] = [w for w in report.issues.warnings if str(w.path) == f"{prefix}.master"]
    assert (
        "is not a field of the bridge plugin (release v1.9.1), which ignores it" in master.message
    )
    assert "boolean" in errors[f"{prefix}.hairpinMode"]
    assert "integer" in errors[f"{prefix}.vlan"] and "'110'" in errors[f"{prefix}.vlan"]


def test_valid_macvlan_config_has_no_issues() -> None:
    issues = Issues()
    model = parse_parameters(params(conflist(MACVLAN)), FieldPath(), issues, complete=True)
    assert model is not None and not issues.items
    assert model.if_name == "net1" and model.config is not None


def test_config_as_json_string_means_the_same_as_an_object() -> None:
    as_object = params(conflist(MACVLAN))
    as_string = params(json.dumps(conflist(MACVLAN)))
    i1, i2 = Issues(), Issues()
    m1 = parse_parameters(as_object, FieldPath(), i1, complete=True)
    m2 = parse_parameters(as_string, FieldPath(), i2, complete=True)
    assert m1 == m2 and m1 is not None


def test_config_string_that_is_not_json() -> None:
    assert errors_of(params('{"cniVersion": "1.0.0",'))["config"].startswith(
        "is a string but not a network configuration: the JSON text is not JSON"
    )


@pytest.mark.parametrize(
    "name,fragment",
    [
        ("", "must not be empty"),
        ("a" * 16, "at most 15"),
        ("é" * 8, "16 bytes"),
        (".", "'.' or '..'"),
        ("..", "'.' or '..'"),
        ("net/1", "'/'"),
        ("net:1", "':'"),
        ("net 1", "whitespace"),
        ("net\t1", "whitespace"),
        ("eth0", "primary interface"),
    ],
)
def test_ifnames_the_kernel_or_pod_would_refuse(name: str, fragment: str) -> None:
    assert fragment in errors_of(params(conflist(MACVLAN), ifName=name))["ifName"]


def test_ifname_of_fifteen_bytes_is_fine() -> None:
    assert errors_of(params(conflist(MACVLAN), ifName="a" * 15)) == {}


def test_duplicate_ifnames_across_requests_of_one_claim() -> None:
    doc = claim(requests=("a", "b"))
    doc["spec"]["devices"]["config"] = [
        {
            "requests": [r],
            "opaque": {
                "driver": "cni.dra.networking.x-k8s.io",
                "parameters": params(conflist(MACVLAN)),
            },
        }
        for r in ("a", "b")
    ]
    errors = doc_errors(doc)
    assert list(errors) == ["spec.devices.config[1].opaque.parameters.ifName"]
    assert (
        "already used by request 'a'" in errors["spec.devices.config[1].opaque.parameters.ifName"]
    )


@pytest.mark.parametrize("ptype", ["../../bin/sh", "/usr/bin/id", "..", "a/b", "", "sh;id", 7])
def test_plugin_type_must_be_a_bare_name(ptype: object) -> None:
    errors = errors_of(params(conflist({"type": ptype})))
    assert "config.plugins[0].type" in errors


def test_ipam_type_must_be_a_bare_name_too() -> None:
    errors = errors_of(params(conflist({"type": "macvlan", "ipam": {"type": "../host-local"}})))
    assert "not a bare plugin name" in errors["config.plugins[0].ipam.type"]


@pytest.mark.parametrize(
    "config,path,fragment",
    [
        (conflist(MACVLAN, version="0.5.0"), "config.cniVersion", "allowed: 0.1.0"),
        ({"cniVersion": "1.0.0", "plugins": [MACVLAN]}, "config.name", "is required"),
        (conflist(), "config.plugins", "at least one plugin"),
        ({"cniVersion": "1.0.0", "name": "x"}, "config", "neither"),
        ({**conflist(MACVLAN), "master": "eth0"}, "config.master", "unknown conflist field"),
    ],
)
def test_conflist_structure_mistakes(config: dict[str, object], path: str, fragment: str) -> None:
    assert fragment in errors_of(params(config))[path]


def host_local(*range_sets: list[dict[str, str]], **extra: object) -> dict[str, object]:
    return params(
        conflist(
            {"type": "bridge", "ipam": {"type": "host-local", "ranges": list(range_sets), **extra}}
        )
    )


IPAM = "config.plugins[0].ipam"


@pytest.mark.parametrize(
    "doc,path,fragment",
    [
        (host_local([{"subnet": "198.18.0.0"}]), f"{IPAM}.ranges[0][0].subnet", "prefix length"),
        (
            host_local([{"subnet": "198.18.0.300/24"}]),
            f"{IPAM}.ranges[0][0].subnet",
            "prefix length",
        ),
        (host_local([{"subnet": "198.18.0.5/24"}]), f"{IPAM}.ranges[0][0].subnet", "host bits"),
        (
            host_local([{"subnet": "198.18.0.0/24", "gateway": "198.18.1.1"}]),
            f"{IPAM}.ranges[0][0].gateway",
            "outside the subnet",
        ),
        (
            host_local([{"subnet": "198.18.0.0/24", "rangeStart": "198.18.1.1"}]),
            f"{IPAM}.ranges[0][0].rangeStart",
            "outside the subnet",
        ),
        (
            host_local([{"subnet": "198.18.0.0/24", "rangeEnd": "2001:db8::1"}]),
            f"{IPAM}.ranges[0][0].rangeEnd",
            "outside the subnet",
        ),
        (
            host_local(
                [{"subnet": "198.18.0.0/24", "rangeStart": "198.18.0.9", "rangeEnd": "198.18.0.2"}]
            ),
            f"{IPAM}.ranges[0][0].rangeStart",
            "after rangeEnd",
        ),
        (
            host_local([{"subnet": "198.18.0.0/24"}], [{"subnet": "198.18.0.128/25"}]),
            f"{IPAM}.ranges[1][0].subnet",
            "overlaps",
        ),
        (
            host_local([{"subnet": "198.18.0.0/24"}, {"subnet": "198.18.0.0/16"}]),
            f"{IPAM}.ranges[0][1].subnet",
            "overlaps",
        ),
        (
            host_local([{"subnet": "198.18.0.0/24"}, {"subnet": "2001:db8::/64"}]),
            f"{IPAM}.ranges[0]",
            "mixes IPv4 and IPv6",
        ),
        (host_local([{"subnet": "198.18.0.0/31"}]), f"{IPAM}.ranges[0][0].subnet", "too small"),
        (
            host_local(
                [{"subnet": "198.18.0.0/24"}],
                routes=[{"dst": "203.0.113.0/24", "gw": "2001:db8::1"}],
            ),
            f"{IPAM}.routes[0].gw",
            "IPv6",
        ),
        (
            params(
                conflist(
                    {
                        "type": "macvlan",
                        "ipam": {"type": "static", "addresses": [{"address": "192.0.2.1"}]},
                    }
                )
            ),
            f"{IPAM}.addresses[0].address",
            "prefix length",
        ),
        (
            params(conflist({"type": "macvlan", "ipam": {"type": "host-local"}})),
            f"{IPAM}.ranges",
            "needs ranges",
        ),
    ],
)
def test_ipam_mistakes(doc: dict[str, object], path: str, fragment: str) -> None:
    errors = errors_of(doc)
    assert fragment in errors.get(path, ""), errors


@pytest.mark.parametrize(
    "plugin,path,fragment",
    [
        ({"type": "vlan", "master": "eth1", "vlanId": 4095}, "vlanId", "0 to 4094"),
        ({"type": "vlan", "master": "eth1", "vlanId": -1}, "vlanId", "0 to 4094"),
        ({"type": "bridge", "vlan": 5000}, "vlan", "0 to 4094"),
        ({"type": "bridge", "vlanTrunk": [{"minID": 0}]}, "vlanTrunk[0].minID", "1 to 4094"),
        ({"type": "macvlan", "mtu": 67}, "mtu", "between 68 and 65535"),
        ({"type": "macvlan", "mtu": 70000}, "mtu", "between 68 and 65535"),
        ({"type": "tuning", "mtu": 9001, "mac": "zz"}, "mac", "MAC address"),
        (
            {"type": "macvlan", "mode": "bridged"},
            "mode",
            "allowed: 'bridge', 'private', 'vepa', 'passthru'",
        ),
        ({"type": "ipvlan", "mode": "l4"}, "mode", "allowed: 'l2', 'l3', 'l3s'"),
        ({"type": "vlan", "master": "eth1"}, "<document>", "vlanId"),
        ({"type": "bandwidth", "ingressRate": 1000}, "ingressRate", "set together"),
        ({"type": "host-device", "device": "this-name-is-too-long"}, "device", "interface name"),
    ],
)
def test_out_of_range_values(plugin: dict[str, object], path: str, fragment: str) -> None:
    errors = errors_of(params(conflist(plugin)))
    full = "config.plugins[0]" if path == "<document>" else f"config.plugins[0].{path}"
    assert fragment in errors.get(full, ""), errors


def test_mtu_zero_means_kernel_default() -> None:
    assert errors_of(params(conflist({"type": "macvlan", "mtu": 0}))) == {}


def test_unknown_plugin_type_is_a_warning() -> None:
    issues = Issues()
    parse_parameters(
        params(conflist({"type": "sriov", "deviceID": "0000:01:00.1"})),
        FieldPath(),
        issues,
        complete=True,
    )
    assert not issues.errors
    assert [str(w.path) for w in issues.warnings] == ["config.plugins[0].type"]


def test_single_plugin_conf_is_accepted_with_plugin_paths_at_config() -> None:
    conf = {"cniVersion": "0.4.0", "name": "n", "type": "macvlan", "mode": "nope"}
    assert "config.mode" in errors_of(params(conf))


def test_every_reference_plugin_is_known() -> None:
    from cnidra.api.plugin_schema import known_types

    assert known_types("plugins") >= {
        "bridge",
        "macvlan",
        "ipvlan",
        "vlan",
        "host-device",
        "ptp",
        "tap",
        "dummy",
        "loopback",
        "tuning",
        "bandwidth",
        "portmap",
        "firewall",
        "sbr",
        "vrf",
    }
    assert known_types("ipam") >= {"host-local", "static", "dhcp"}


def test_config_too_big_for_status_is_a_warning() -> None:
    big = conflist(
        MACVLAN, {"type": "tuning", "sysctl": {f"net.ipv4.conf.all.k{i}": "1" for i in range(600)}}
    )
    issues = Issues()
    validate_network_config(big, FieldPath(("config",)), issues)
    assert not issues.errors
    assert any("10240 bytes" in w.message for w in issues.warnings)


def test_capabilities_need_a_plugin_that_declares_them() -> None:
    caps = {"portMappings": [{"hostPort": 8080, "containerPort": 80}], "mac": "02:00:00:00:00:01"}
    declared = conflist({**MACVLAN, "capabilities": {"mac": True}})
    errors = errors_of(params(declared, capabilities=caps))
    assert list(errors) == ["capabilities.portMappings"]


@pytest.mark.parametrize(
    "field,value,fragment",
    [
        ("capabilities", {"ips": ["192.0.2.1"]}, "prefix length"),
        ("capabilities", {"bandwidth": {"ingressRate": -1}}, "greater than or equal"),
        (
            "capabilities",
            {"portMappings": [{"hostPort": 0, "containerPort": 80}]},
            "greater than or equal",
        ),
        ("capabilities", {"infinibandGUID": "xx"}, "InfiniBand GUID"),
        ("capabilities", {"speed": 1}, "unknown field"),
        ("args", {"K8S_POD_NAME": "a;b"}, "';' or '='"),
        ("ipamClaimReference", "Not_A_Name", "Kubernetes object name"),
        ("colour", "blue", "allowed: apiVersion"),
    ],
)
def test_optional_fields_are_checked(field: str, value: object, fragment: str) -> None:
    errors = errors_of(
        params(
            conflist(
                {
                    **MACVLAN,
                    "capabilities": {
                        "ips": True,
                        "bandwidth": True,
                        "portMappings": True,
                        "infinibandGUID": True,
                    },
                }
            ),
            **{field: value},
        )
    )
    assert any(fragment in m for m in errors.values()), errors


def test_ipam_claim_reference_with_static_ips_is_an_error() -> None:
    plugin = {**MACVLAN, "capabilities": {"ips": True}}
    errors = errors_of(
        params(
            conflist(plugin),
            capabilities={"ips": ["192.0.2.5/24"]},
            ipamClaimReference="vm-a.tenantred",
        )
    )
    assert "cannot be combined" in errors["ipamClaimReference"]


def test_legacy_kind_cni_is_accepted_with_a_warning() -> None:
    issues = Issues()
    model = parse_parameters(
        {**params(conflist(MACVLAN)), "kind": "CNI"}, FieldPath(), issues, complete=True
    )
    assert model is not None and model.is_legacy_kind
    assert [str(w.path) for w in issues.warnings] == ["kind"]


def test_wrong_api_version_and_kind() -> None:
    errors = errors_of({**params(conflist(MACVLAN)), "apiVersion": "v1", "kind": "Pod"})
    assert (
        "cni.networking.x-k8s.io/v1alpha1" in errors["apiVersion"] and "CNIConfig" in errors["kind"]
    )


def test_config_naming_an_unknown_request() -> None:
    doc = claim()
    doc["spec"]["devices"]["config"] = [
        {
            "requests": ["nope"],
            "opaque": {
                "driver": "cni.dra.networking.x-k8s.io",
                "parameters": params(conflist(MACVLAN)),
            },
        }
    ]
    errors = doc_errors(doc)
    assert "spec.devices.config[0].requests[0]" in errors


def test_template_paths_start_at_spec_spec() -> None:
    doc = claim()
    doc["kind"] = "ResourceClaimTemplate"
    doc["spec"] = {"spec": doc["spec"]}
    doc["spec"]["spec"]["devices"]["config"] = [
        {
            "opaque": {
                "driver": "cni.dra.networking.x-k8s.io",
                "parameters": params(conflist(MACVLAN), ifName=""),
            }
        }
    ]
    assert "spec.spec.devices.config[0].opaque.parameters.ifName" in doc_errors(doc)


def test_other_drivers_configs_are_ignored() -> None:
    doc = claim()
    doc["spec"]["devices"]["config"] = [
        {"opaque": {"driver": "gpu.example.com", "parameters": {"anything": True}}}
    ]
    assert doc_errors(doc) == {}


def test_deviceclass_supplies_what_the_claim_leaves_out() -> None:
    dclass = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "cni.networking.x-k8s.io"},
        "spec": {
            "config": [
                {
                    "opaque": {
                        "driver": "cni.dra.networking.x-k8s.io",
                        "parameters": {
                            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                            "kind": "CNIConfig",
                            "config": conflist(MACVLAN),
                        },
                    }
                }
            ]
        },
    }
    doc = claim()
    only_ifname = {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIConfig",
        "ifName": "net7",
    }
    doc["spec"]["devices"]["config"] = [
        {"opaque": {"driver": "cni.dra.networking.x-k8s.io", "parameters": only_ifname}}
    ]
    assert doc_errors(dclass, doc) == {}
    assert "no config sets config" in doc_errors(doc)["spec.devices.requests[0]"]


def test_every_error_kind_of_document_has_a_path_and_exit_code_semantics() -> None:
    reports = validate_documents([[], "text", {"kind": "Service", "apiVersion": "v1"}])
    assert [str(r.issues.errors[0].path) for r in reports[:2]] == ["<document>", "<document>"]
    # a bundle's other kinds are skipped with a note, not failed
    # (skipped, as another driver's claims are: `-o json` lists it under `skipped`)
    assert not reports[2].issues.errors and not reports[2].issues.warnings
    assert reports[2].skipped and "not a kind cnidra judges" in reports[2].skipped


def named_claim(name: str, if_names: tuple[str | None, ...]) -> dict[str, object]:
    """A claim whose requests r0, r1... ask for the given names (None: implicit)."""
    requests = tuple(f"r{i}" for i in range(len(if_names)))
    doc = claim(requests=requests)
    doc["metadata"] = {"name": name, "namespace": "team"}
    config = []
    for request, if_name in zip(requests, if_names, strict=True):
        p = params(conflist(MACVLAN))
        if if_name is None:
            del p["ifName"]
        else:
            p["ifName"] = if_name
        config.append(
            {
                "requests": [request],
                "opaque": {"driver": "cni.dra.networking.x-k8s.io", "parameters": p},
            }
        )
    doc["spec"]["devices"]["config"] = config
    return doc


def pod_with(*claims: str, kind: str = "Pod") -> dict[str, object]:
    spec = {
        "containers": [{"name": "c", "image": "x"}],
        "resourceClaims": [{"name": f"pc-{c}", "resourceClaimName": c} for c in claims],
    }
    meta = {"name": "p", "namespace": "team"}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": meta,
        "spec": {"template": {"spec": spec}},
    }


@pytest.mark.parametrize("kind", ["Pod", "Deployment"])
def test_a_pods_interface_names_are_checked_across_its_claims(kind: str) -> None:
    """Each claim is fine alone; the pod that uses both would get data1 twice: prepare would
    refuse it, so validate does, at the pod's claim entry, naming both."""
    a, b = named_claim("a", ("data1", None)), named_claim("b", (None, "data1"))
    assert doc_errors(a) == {} and doc_errors(b) == {}
    errors = doc_errors(a, b, pod_with("a", "b", kind=kind))
    base = "spec" if kind == "Pod" else "spec.template.spec"
    message = errors[f"{base}.resourceClaims[1]"]
    assert "pod claim 'pc-b' request 'r1'" in message
    assert "'data1' is already used by pod claim 'pc-a' request 'r0'" in message


def test_implicit_names_across_claims_do_not_collide_and_unknown_claims_are_noted() -> None:
    a, b = named_claim("a", (None, None)), named_claim("b", ("net1", None))
    reports = validate_documents([a, b, pod_with("a", "b", "elsewhere")])
    pod = reports[2]
    assert not pod.issues.errors
    [note] = pod.issues.warnings
    assert str(note.path) == "spec.resourceClaims[2]"
    assert "ResourceClaim team/elsewhere is not in the input" in note.message
