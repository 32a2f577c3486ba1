from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from cnidra.api.convert import (
    Conversion,
    ConvertError,
    OutputKind,
    convert,
    extract_config,
    read_inputs,
    read_source,
    render_yaml,
    to_document,
)
from cnidra.api.ipam import pool_from_object
from cnidra.api.multus import NETWORKS_ANNOTATION, AnnotationError, parse_networks, pod_template
from cnidra.api.validate import validate_documents
from cnidra.cli.main import app

EXAMPLES = Path(__file__).parents[2] / "examples" / "convert"


@pytest.mark.parametrize("kind", list(OutputKind))
def test_conflist_round_trips_and_validates(kind: OutputKind) -> None:
    text = (EXAMPLES / "bridge.conflist").read_text()
    out = yaml.safe_load(render_yaml(to_document(read_source(text), kind)))
    assert extract_config(out) == json.loads(text)
    assert list(extract_config(out)["plugins"][0]) == list(json.loads(text)["plugins"][0])
    reports = validate_documents([out])
    assert not reports[0].issues.errors


def test_nad_keeps_namespace_and_converts_its_config_string() -> None:
    source = read_source((EXAMPLES / "macvlan-nad.yaml").read_text())
    doc = to_document(source)
    assert doc["metadata"] == {"name": "macvlan-conf", "namespace": "telco"}
    assert (
        doc["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
        == "cni.networking.x-k8s.io"
    )
    assert extract_config(doc)["type"] == "macvlan"


def test_nad_without_name_in_config_gets_the_nad_name() -> None:
    nad = {
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "n1"},
        "spec": {"config": json.dumps({"cniVersion": "1.0.0", "type": "macvlan"})},
    }
    assert read_source(yaml.safe_dump(nad)).config["name"] == "n1"


def test_name_and_ifname_options() -> None:
    doc = to_document(
        read_source('{"cniVersion":"1.0.0","name":"My_Net","type":"ptp"}'),
        OutputKind.CLAIM,
        if_name="data0",
    )
    assert doc["metadata"]["name"] == "my-net"
    assert doc["spec"]["devices"]["config"][0]["opaque"]["parameters"]["ifName"] == "data0"


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("{", "is not JSON"),
        ('{"cniVersion": "1.0.0", "type": "bridge",}', "is not JSON"),  # libcni refuses too
        ('{"name": "a", "name": "b", "type": "bridge"}', "duplicate key 'name'"),
        ("[1, 2]", "expected a CNI config"),
        ('{"cniVersion": "1.0.0"}', "neither plugins"),
        ("type: bridge\nname: n\n", "is JSON"),
        ("kind: NetworkAttachmentDefinition\nmetadata: {name: n}\nspec: {}\n", "no spec.config"),
        (
            "kind: NetworkAttachmentDefinition\nmetadata: {name: sriov, annotations: "
            "{k8s.v1.cni.cncf.io/resourceName: intel.com/sriov}}\n",
            "names only the resource intel.com/sriov",
        ),
        (
            "kind: NetworkAttachmentDefinition\nmetadata: {name: n}\nspec: {config: '{nope'}\n",
            "spec.config is not JSON",
        ),
        ("kind: NetworkAttachmentDefinition\nmetadata: []\n", "metadata must be an object"),
        ("kind: NetworkAttachmentDefinition\nmetadata: {}\nspec: [1]\n", "spec must be"),
        ("kind: Pod\nmetadata: {name: p}\n", "found Pod"),
        ("", "is empty"),
    ],
)
def test_bad_inputs_say_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(ConvertError, match=fragment):
        read_source(text)


SHIPPED = Path(__file__).parents[2] / "deploy" / "deviceclass.yaml"


def shipped_verdict(docs: list[dict[str, object]]) -> list[str]:
    policy = [d for d in yaml.safe_load_all(SHIPPED.read_text()) if d]
    reports = validate_documents(docs, policy)
    return [f"{r.kind}/{r.name}: {i.path}: {i.message}" for r in reports for i in r.issues.errors]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_converted_example_passes_the_shipped_policy(path: Path) -> None:
    sources, workloads = read_inputs(path.read_text())
    result = convert(sources, workloads)
    assert result.docs
    assert shipped_verdict(result.docs) == []


def test_what_needs_adapting_is_adapted_and_said() -> None:
    sources, _ = read_inputs((EXAMPLES / "nads-to-adapt.yaml").read_text())
    result = convert(sources)
    kinds = [d["kind"] for d in result.docs]
    assert kinds == ["CNIIPPool", "ResourceClaimTemplate", "CNIIPPool", "ResourceClaimTemplate"]
    bridge = extract_config(result.docs[1])
    assert bridge["isGateway"] is False  # harmless default
    # host-local (its dataDir dropped on the way) became a pool
    assert bridge["ipam"] == {"type": "cnidra", "pool": "telco-br-net"}
    assert result.docs[0]["spec"] == {
        "ranges": [{"subnet": "192.0.2.0/24", "gateway": "192.0.2.1"}],
        "namespaces": ["telco"],
    }
    pool = result.docs[2]
    assert pool["spec"] == {
        "ranges": [{"subnet": "192.0.2.0/24", "rangeStart": "192.0.2.10", "gateway": "192.0.2.1"}],
        "namespaces": ["telco"],
        "exclude": ["192.0.2.100/30"],
    }
    assert extract_config(result.docs[3])["ipam"] == {"type": "cnidra", "pool": "telco-wb-net"}
    assert any("dataDir" in n for n in result.notes) and any(
        "whereabouts" in n for n in result.notes
    )
    [refused] = result.refused  # the SR-IOV NAD: never silently
    assert "intel.com/intel_sriov_netdevice" in refused and "examples/sriov-vf.yaml" in refused
    # a bridge NAD selects its bridge as a macvlan one selects its master
    [request] = result.docs[1]["spec"]["spec"]["devices"]["requests"]
    assert '.ifName == "br1"' in request["exactly"]["selectors"][0]["cel"]["expression"]


def test_whereabouts_range_forms_and_dual_stack() -> None:
    nad = {
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "ds", "namespace": "t"},
        "spec": {
            "config": json.dumps(
                {
                    "cniVersion": "0.3.1",
                    "type": "macvlan",
                    "ipam": {
                        "type": "whereabouts",
                        "range": "198.18.62.10-198.18.62.50/24",
                        "ipRanges": [
                            {"range": "2001:db8:62::/64", "exclude": ["2001:db8:62::/120"]}
                        ],
                        "routes": [{"dst": "198.18.63.0/24"}],
                    },
                }
            )
        },
    }
    result = convert([read_source(yaml.safe_dump(nad))])
    pool, template = result.docs
    assert pool["spec"]["ranges"] == [
        {"subnet": "198.18.62.0/24", "rangeStart": "198.18.62.10", "rangeEnd": "198.18.62.50"},
        {"subnet": "2001:db8:62::/64"},
    ]
    assert pool["spec"]["exclude"] == ["2001:db8:62::/120"]
    assert extract_config(template)["ipam"]["routes"] == [{"dst": "198.18.63.0/24"}]
    assert shipped_verdict(result.docs) == []


def nad(name: str, ipam: dict[str, Any], namespace: str = "t") -> dict[str, Any]:
    config = {"cniVersion": "1.0.0", "type": "macvlan", "master": "eth1", "ipam": ipam}
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"config": json.dumps(config)},
    }


def convert_nads(*nads: dict[str, Any], reference: bool = False) -> Conversion:
    sources, workloads = read_inputs(yaml.safe_dump_all(nads), "nads.yaml")
    return convert(sources, workloads, reference=reference)


@pytest.mark.parametrize(
    ("ipam", "ranges", "routes"),
    [
        pytest.param(
            {"type": "host-local", "subnet": "198.18.64.0/24"},
            [{"subnet": "198.18.64.0/24", "gateway": "198.18.64.1"}],  # host-local's own .1
            None,
            id="single-range",
        ),
        pytest.param(
            {
                "type": "host-local",
                "subnet": "198.18.64.0/24",
                "rangeStart": "198.18.64.100",
                "rangeEnd": "198.18.64.200",
                "gateway": "198.18.64.254",
            },
            [
                {
                    "subnet": "198.18.64.0/24",
                    "rangeStart": "198.18.64.100",
                    "rangeEnd": "198.18.64.200",
                    "gateway": "198.18.64.254",
                }
            ],
            None,
            id="rangeStart-rangeEnd",
        ),
        pytest.param(
            {
                "type": "host-local",
                "ranges": [
                    [{"subnet": "198.18.64.0/24", "rangeStart": "198.18.64.10"}],
                    [{"subnet": "2001:db8:64::/64", "gateway": "2001:db8:64::fe"}],
                ],
                "routes": [
                    {"dst": "198.18.65.0/24", "gw": "198.18.64.1"},
                    {"dst": "2001:db8:65::/64"},
                ],
            },
            [
                {
                    "subnet": "198.18.64.0/24",
                    "rangeStart": "198.18.64.10",
                    "gateway": "198.18.64.1",
                },
                {"subnet": "2001:db8:64::/64", "gateway": "2001:db8:64::fe"},
            ],
            [{"dst": "198.18.65.0/24", "gw": "198.18.64.1"}, {"dst": "2001:db8:65::/64"}],
            id="dual-stack-with-routes",
        ),
    ],
)
def test_host_local_becomes_a_pool_that_passes_the_shipped_policy(
    ipam: dict[str, Any], ranges: list[dict[str, str]], routes: list[dict[str, str]] | None
) -> None:
    result = convert_nads(nad("hl", ipam))
    pool, template = result.docs
    assert pool["kind"] == "CNIIPPool" and pool["metadata"] == {"name": "t-hl"}
    assert pool["spec"]["ranges"] == ranges
    assert pool["spec"]["namespaces"] == ["t"]  # the claims' namespace: a tenant's may use it
    assert pool["spec"].get("routes") == routes
    assert extract_config(template)["ipam"] == {"type": "cnidra", "pool": "t-hl"}
    assert shipped_verdict(result.docs) == []
    assert not result.refused
    [note] = [n for n in result.notes if "host-local IPAM became CNIIPPool t-hl" in n]
    assert "NetworkAttachmentDefinition t/hl" in note
    assert "one pool per network name and node" in note and "unique cluster-wide" in note
    assert "host-local handed out are not carried over" in note


def test_host_local_pool_hands_out_what_host_local_did() -> None:
    """Two ranges of one range set in one subnet are one pool range, the addresses between them
    excluded; the gateway host-local claims is never handed out; a small subnet gets blocks
    that fit."""
    split = [
        {"subnet": "198.18.66.0/24", "rangeStart": "198.18.66.10", "rangeEnd": "198.18.66.50"},
        {"subnet": "198.18.66.0/24", "rangeStart": "198.18.66.100", "rangeEnd": "198.18.66.120"},
    ]
    small = {"type": "host-local", "subnet": "198.18.67.0/29"}
    result = convert_nads(
        nad("split", {"type": "host-local", "ranges": [split]}), nad("small", small)
    )
    assert shipped_verdict(result.docs) == []
    split_pool, small_pool = (pool_from_object(d) for d in result.docs if d["kind"] == "CNIIPPool")
    given = {int(ip) for ip in ipaddress.ip_network("198.18.66.0/24")}
    host_local = {a for a in given if 10 <= a % 256 <= 50 or 100 <= a % 256 <= 120}
    pooled = {a for a in given if split_pool.hands_out(ipaddress.IPv4Address(a))}
    assert pooled == host_local
    assert small_pool.spec.block_size == 8
    assert [str(a) for a in small_pool.usable(small_pool.block(0, 0))] == [
        f"198.18.67.{i}"
        for i in range(2, 7)  # .1 is host-local's gateway, .7 the broadcast
    ]


@pytest.mark.parametrize(
    ("ipam", "fragments"),
    [
        pytest.param(
            {"type": "host-local", "ranges": [[{"subnet": "198.18.68.0/24"}],
                                              [{"subnet": "198.18.69.0/24"}]]},
            ["ipam.ranges[0] and ipam.ranges[1] are both IPv4 range sets",
             "one range per address family"],
            id="two-ipv4-range-sets",
        ),
        pytest.param(
            {"type": "host-local", "subnet": "198.18.68.0/24",
             "ranges": [[{"subnet": "198.18.69.0/24"}]]},
            ["ipam and ipam.ranges[0] are both IPv4 range sets"],
            id="subnet-and-ranges",
        ),
        pytest.param(
            {"type": "host-local", "ranges": [[{"subnet": "198.18.68.0/24"},
                                               {"subnet": "198.18.69.0/24"}]]},
            ["ipam.ranges[0] hands out addresses of 198.18.68.0/24", "one subnet"],
            id="two-subnets-in-one-range-set",
        ),
        pytest.param(
            {"type": "host-local", "ranges": [[{"subnet": "198.18.68.0/24",
                                                "rangeStart": "198.18.70.1"}]]},
            ["ipam.ranges[0][0].rangeStart 198.18.70.1 is not in subnet 198.18.68.0/24"],
            id="outside-its-subnet",
        ),
        pytest.param(
            {"type": "host-local"},
            ["neither subnet nor ranges"],
            id="no-range",
        ),
    ],
)  # fmt: skip
def test_host_local_a_pool_cannot_hold_is_refused_naming_the_field(
    ipam: dict[str, Any], fragments: list[str]
) -> None:
    result = convert_nads(
        nad("bad", ipam), nad("good", {"type": "host-local", "subnet": "198.18.71.0/24"})
    )
    [refused] = result.refused  # exit 1 from the CLI; the other NAD is still converted
    assert refused.startswith("NetworkAttachmentDefinition t/bad: host-local ")
    for fragment in fragments:
        assert fragment in refused
    assert [d["metadata"]["name"] for d in result.docs] == ["t-good", "good"]
    assert shipped_verdict(result.docs) == []


def test_a_conflist_with_host_local_becomes_a_pool_and_says_which_file() -> None:
    conflist = {
        "cniVersion": "1.0.0",
        "name": "storage",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "br-storage",
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "198.51.100.0/24"}]],
                         "resolvConf": "/etc/resolv.conf"},
            },
            {"type": "tuning", "mtu": 1400},
        ],
    }  # fmt: skip
    sources, _ = read_inputs(json.dumps(conflist), "storage.conflist")
    result = convert(sources)
    pool, template = result.docs
    assert pool["spec"]["namespaces"] == ["default"]
    assert extract_config(template)["plugins"][0]["ipam"] == {
        "type": "cnidra",
        "pool": "default-storage",
    }
    assert shipped_verdict(result.docs) == []
    assert any(
        n.startswith("CNI config storage (storage.conflist): host-local IPAM became")
        and "the input names no namespace" in n
        for n in result.notes
    )
    assert any("resolvConf '/etc/resolv.conf' not carried" in n for n in result.notes)


def test_a_nad_used_from_two_namespaces_gives_one_pool_serving_both() -> None:
    shared = nad("shared", {"type": "host-local", "subnet": "198.18.72.0/24"}, "infra")
    workloads = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "p",
                "namespace": ns,
                "annotations": {NETWORKS_ANNOTATION: "infra/shared"},
            },
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }
        for ns in ("team-a", "team-b")
    ]
    result = convert_nads(shared, *workloads)
    [pool] = [pool_from_object(d) for d in result.docs if d["kind"] == "CNIIPPool"]
    assert pool.name == "infra-shared" and pool.spec.namespaces == ["team-a", "team-b"]
    for ns in ("team-a", "team-b"):  # what prepare asks of a tenant's network
        assert pool.tenant_problem(ns, None) is None
    assert shipped_verdict(result.docs) == []


def test_reference_to_a_host_local_nad_is_refused_saying_what_to_do() -> None:
    pooled = nad("pooled", {"type": "cnidra", "pool": "t-data"})
    result = convert_nads(
        nad("blue", {"type": "host-local", "subnet": "198.18.73.0/24"}), pooled, reference=True
    )
    params = [
        d["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"] for d in result.docs
    ]
    assert [p["network"] for p in params] == [{"attachmentDefinition": "pooled"}]
    [refused] = result.refused  # the host-local NAD: it would fail at prepare, so not emitted
    assert refused.startswith("NetworkAttachmentDefinition t/blue: its converted form does not")
    assert "ipam.type" in refused and "one pool per network name" in refused
    assert "`cnidra convert nads.yaml` without --reference" in refused


def test_reference_refusal_reaches_stderr_with_exit_1(tmp_path: Path) -> None:
    path = tmp_path / "nads.yaml"
    path.write_text(yaml.safe_dump(nad("blue", {"type": "host-local", "subnet": "198.18.73.0/24"})))
    result = CliRunner().invoke(app, ["convert", "--reference", str(path)])
    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())  # as rich wraps it
    assert "not converted: NetworkAttachmentDefinition t/blue" in said
    assert f"`cnidra convert {path}` without --reference" in said
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        ("a", [("team/a", None)]),
        ("a, other/b@data0 ,c@net5", [("team/a", None), ("other/b", "data0"), ("team/c", "net5")]),
        ('[{"name": "a", "interface": "n3"}, {"name": "b", "namespace": "x"}]',
         [("team/a", "n3"), ("x/b", None)]),
    ],
)  # fmt: skip
def test_every_form_of_the_networks_annotation(
    annotation: str, expected: list[tuple[str, str | None]]
) -> None:
    assert [(s.reference, s.interface) for s in parse_networks(annotation, "team")] == expected


@pytest.mark.parametrize(
    ("annotation", "fragment"),
    [
        ("[{", "is not JSON"),
        ('{"name": "a"}', "is not a NetworkAttachmentDefinition name"),
        ('[{"name": "a", "colour": "red"}]', "unknown field(s) colour"),
        ('[{"name": 5}]', "must be a string"),
        ("Bad_Name", "is not a NetworkAttachmentDefinition name"),
        ("a/b/c", "is not a namespace"),
    ],
)
def test_a_bad_annotation_is_named(annotation: str, fragment: str) -> None:
    with pytest.raises(AnnotationError, match=re.escape(fragment)):
        parse_networks(annotation, "team")


@pytest.mark.parametrize("kind", ["Pod", "StatefulSet", "DaemonSet", "Job", "CronJob"])
def test_each_workload_kind_is_rewritten_to_claim_its_networks(kind: str) -> None:
    pod: dict[str, Any] = {
        "metadata": {"annotations": {NETWORKS_ANNOTATION: "data@n3", "keep": "me"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    meta = {"name": "w", "namespace": "t"}
    workload: dict[str, Any]
    if kind == "Pod":
        workload = {"kind": kind, "metadata": {**meta, **pod["metadata"]}, "spec": pod["spec"]}
    elif kind == "CronJob":
        job = {"spec": {"template": pod}}
        workload = {"kind": kind, "metadata": meta, "spec": {"jobTemplate": job}}
    else:
        workload = {"kind": kind, "metadata": meta, "spec": {"template": pod}}
    [source] = read_inputs(yaml.safe_dump(nad("data", {"type": "cnidra", "pool": "p"})))[0]
    result = convert([source], [workload])
    assert not result.refused, result.refused
    template, rewritten = result.docs
    assert template["metadata"] == {"name": "w-networks", "namespace": "t"}
    [config] = template["spec"]["spec"]["devices"]["config"]
    params = config["opaque"]["parameters"]
    assert params["config"]["master"] == "eth1" and params["ifName"] == "n3"
    out_pod = pod_template(rewritten)
    assert out_pod is not None
    assert out_pod["metadata"]["annotations"] == {"keep": "me"}
    assert out_pod["spec"]["resourceClaims"] == [
        {"name": "networks", "resourceClaimTemplateName": "w-networks"}
    ]
    # the fail-closed gate holds the container until the interfaces exist
    assert out_pod["spec"]["containers"][0]["resources"] == {"claims": [{"name": "networks"}]}
    assert NETWORKS_ANNOTATION in pod["metadata"]["annotations"]  # the input is not changed
    assert "resources" not in pod["spec"]["containers"][0]


def test_read_inputs_takes_a_kubectl_list() -> None:
    deployment = yaml.safe_load_all((EXAMPLES / "multus-deployment.yaml").read_text())
    listed = {"apiVersion": "v1", "kind": "List", "items": [d for d in deployment if d]}
    sources, workloads = read_inputs(yaml.safe_dump(listed))
    assert [s.name for s in sources] == ["data", "storage"] and len(workloads) == 1
