from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cnidra.api.convert import (
    ConvertError,
    OutputKind,
    convert,
    extract_config,
    read_inputs,
    read_source,
    render_yaml,
    to_document,
)
from cnidra.api.multus import NETWORKS_ANNOTATION, AnnotationError, parse_networks, pod_template
from cnidra.api.validate import validate_documents

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
    assert kinds == ["ResourceClaimTemplate", "CNIIPPool", "ResourceClaimTemplate"]
    bridge = extract_config(result.docs[0])
    assert "dataDir" not in bridge["ipam"] and bridge["isGateway"] is False  # harmless default
    pool = result.docs[1]
    assert pool["spec"] == {
        "ranges": [{"subnet": "192.0.2.0/24", "rangeStart": "192.0.2.10", "gateway": "192.0.2.1"}],
        "namespaces": ["telco"],
        "exclude": ["192.0.2.100/30"],
    }
    assert extract_config(result.docs[2])["ipam"] == {"type": "cnidra", "pool": "telco-wb-net"}
    assert any("dataDir" in n for n in result.notes) and any(
        "whereabouts" in n for n in result.notes
    )
    [refused] = result.refused  # the SR-IOV NAD: never silently
    assert "intel.com/intel_sriov_netdevice" in refused and "examples/sriov-vf.yaml" in refused
    # a bridge NAD selects its bridge as a macvlan one selects its master
    [request] = result.docs[0]["spec"]["spec"]["devices"]["requests"]
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
    pod = {"metadata": {"annotations": {NETWORKS_ANNOTATION: "data@n3", "keep": "me"}},
           "spec": {"containers": [{"name": "c", "image": "i"}]}}  # fmt: skip
    meta = {"name": "w", "namespace": "t"}
    workload: dict[str, Any]
    if kind == "Pod":
        workload = {"kind": kind, "metadata": {**meta, **pod["metadata"]}, "spec": pod["spec"]}
    elif kind == "CronJob":
        job = {"spec": {"template": pod}}
        workload = {"kind": kind, "metadata": meta, "spec": {"jobTemplate": job}}
    else:
        workload = {"kind": kind, "metadata": meta, "spec": {"template": pod}}
    result = convert([], [workload])
    template, rewritten = result.docs
    assert template["metadata"] == {"name": "w-networks", "namespace": "t"}
    [config] = template["spec"]["spec"]["devices"]["config"]
    params = config["opaque"]["parameters"]
    assert params["network"] == {"attachmentDefinition": "t/data"} and params["ifName"] == "n3"
    out_pod = pod_template(rewritten)
    assert out_pod is not None
    assert out_pod["metadata"]["annotations"] == {"keep": "me"}
    assert out_pod["spec"]["resourceClaims"] == [
        {"name": "networks", "resourceClaimTemplateName": "w-networks"}
    ]
    assert any("is not in the input" in n for n in result.notes)
    assert NETWORKS_ANNOTATION in pod["metadata"]["annotations"]  # the input is not changed


def test_read_inputs_takes_a_kubectl_list() -> None:
    deployment = yaml.safe_load_all((EXAMPLES / "multus-deployment.yaml").read_text())
    listed = {"apiVersion": "v1", "kind": "List", "items": [d for d in deployment if d]}
    sources, workloads = read_inputs(yaml.safe_dump(listed))
    assert [s.name for s in sources] == ["data", "storage"] and len(workloads) == 1
