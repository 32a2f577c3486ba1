from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cnidra.api.convert import (
    ConvertError,
    OutputKind,
    extract_config,
    read_source,
    render_yaml,
    to_document,
)
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
