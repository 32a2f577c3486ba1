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
        ("{", "neither JSON nor YAML"),
        ("[1, 2]", "expected a CNI config"),
        ('{"cniVersion": "1.0.0"}', "neither plugins"),
        ("kind: NetworkAttachmentDefinition\nspec: {}\n", "no spec.config"),
        ("kind: NetworkAttachmentDefinition\nspec: {config: '{nope'}\n", "not valid JSON"),
    ],
)
def test_bad_inputs_say_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(ConvertError, match=fragment):
        read_source(text)
