"""What the apiserver and the shipped admission refuse, judged offline by `validate_documents`
(issue 41): the namespace label of the claim-config admission rule, a request in another API
version's shape, unknown fields, a container claim naming no pod claim, Multus' annotations
cnidra ignores, and a chained plugin alone in a conf."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cnidra.api.validate import CLAIM_CONFIG_LABEL, Admission, validate_documents
from tests.api.helpers import claim, conflist, params

MACVLAN = {"type": "macvlan", "master": "eth1", "ipam": {"type": "static"}}


def ours() -> dict[str, Any]:
    doc = claim()
    doc["spec"]["devices"]["config"] = [
        {
            "requests": ["net"],
            "opaque": {
                "driver": "cni.dra.networking.x-k8s.io",
                "parameters": params(conflist(MACVLAN)),
            },
        }
    ]
    return doc


def issues(doc: Any, **kw: Any) -> tuple[dict[str, str], dict[str, str]]:
    """As `cnidra validate` judges (the apiserver's and the admission's checks offline)."""
    kw.setdefault("admission", Admission(kw.get("namespace_labels")))
    [report] = validate_documents([doc], **kw)
    return (
        {str(i.path): i.message for i in report.issues.errors},
        {str(i.path): i.message for i in report.issues.warnings},
    )


def test_the_namespace_label_is_a_warning_when_the_labels_are_not_given() -> None:
    errors, warnings = issues(ours(), admission=Admission(None))
    assert "spec.devices.config" not in errors
    assert f"{CLAIM_CONFIG_LABEL}=true" in warnings["spec.devices.config"]
    assert "--namespace-labels" in warnings["spec.devices.config"]


@pytest.mark.parametrize(
    ("labels", "refused"),
    [
        ({}, True),
        ({"team": "a"}, True),
        ({CLAIM_CONFIG_LABEL: "false"}, True),
        ({CLAIM_CONFIG_LABEL: "True"}, True),  # the CEL rule compares with "true" exactly
        ({CLAIM_CONFIG_LABEL: "true", "team": "a"}, False),
    ],
)
def test_the_namespace_label_as_the_shipped_admission_reads_it(
    labels: dict[str, str], refused: bool
) -> None:
    doc = ours()
    doc["metadata"]["namespace"] = "team-a"
    errors, warnings = issues(doc, namespace_labels=labels, admission=Admission(labels))
    assert ("spec.devices.config" in errors) is refused
    assert "spec.devices.config" not in warnings
    if refused:
        assert "namespace team-a may not carry" in errors["spec.devices.config"]
        assert (
            f"kubectl label namespace team-a {CLAIM_CONFIG_LABEL}=true"
            in (errors["spec.devices.config"])
        )


def test_a_claim_without_cnidra_configs_needs_no_label() -> None:
    doc = ours()
    doc["spec"]["devices"]["config"][0]["opaque"]["driver"] = "gpu.example.com"
    errors, warnings = issues(doc, namespace_labels={}, admission=Admission({}))
    assert "spec.devices.config" not in errors and "spec.devices.config" not in warnings


def test_the_webhook_path_does_not_judge_the_label_nor_the_shape() -> None:
    """The webhook runs behind the apiserver's decoding and the admission policies: without
    `admission`, neither the label nor the request's shape is judged again (a field a newer
    apiserver knows is not refused by an older cnidra)."""
    doc = flat("resource.k8s.io/v1")
    doc["spec"]["devices"]["requests"][0]["newField"] = True
    [report] = validate_documents([doc], namespace_labels={})
    paths = {str(i.path) for i in report.issues.items}
    assert not {p for p in paths if p.startswith("spec.devices.requests[0].")}
    assert "spec.devices.config" not in paths


def test_an_admin_class_needs_the_namespace_annotation() -> None:
    doc = ours()
    doc["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = (
        "storage.cni.networking.x-k8s.io"
    )
    _, warnings = issues(doc, admission=Admission({CLAIM_CONFIG_LABEL: "true"}))
    assert "cni.networking.x-k8s.io/device-classes" in warnings["spec.devices.requests"]
    assert "--namespace-annotation" in warnings["spec.devices.requests"]


@pytest.mark.parametrize(
    ("listed", "refused"),
    [
        (None, True),
        ("", True),
        ("other.cni.networking.x-k8s.io", True),
        ("a.cni.networking.x-k8s.io, storage.cni.networking.x-k8s.io", True),  # CEL trims none
        ("a.cni.networking.x-k8s.io,storage.cni.networking.x-k8s.io", False),
    ],
)
def test_the_namespace_annotation_as_the_shipped_admission_reads_it(
    listed: str | None, refused: bool
) -> None:
    doc = ours()
    doc["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = (
        "storage.cni.networking.x-k8s.io"
    )
    annotations = {} if listed is None else {"cni.networking.x-k8s.io/device-classes": listed}
    errors, warnings = issues(doc, admission=Admission({CLAIM_CONFIG_LABEL: "true"}, annotations))
    assert ("spec.devices.requests" in errors) is refused
    assert "spec.devices.requests" not in warnings


def flat(api_version: str) -> dict[str, Any]:
    doc = ours()
    doc["apiVersion"] = api_version
    doc["spec"]["devices"]["requests"] = [
        {"name": "net", "deviceClassName": "cni.networking.x-k8s.io"}
    ]
    return doc


def test_a_v1beta1_request_under_v1_is_refused_naming_exactly() -> None:
    errors, _ = issues(flat("resource.k8s.io/v1"))
    message = errors["spec.devices.requests[0].deviceClassName"]
    assert "belongs under exactly in resource.k8s.io/v1" in message
    errors, _ = issues(flat("resource.k8s.io/v1beta2"))
    assert "spec.devices.requests[0].deviceClassName" in errors


def test_the_flat_shape_is_right_in_v1beta1_and_exactly_is_not() -> None:
    errors, _ = issues(flat("resource.k8s.io/v1beta1"))
    assert not errors
    doc = ours()
    doc["apiVersion"] = "resource.k8s.io/v1beta1"
    errors, _ = issues(doc)
    assert (
        "is not a field of a resource.k8s.io/v1beta1 device request"
        in (errors["spec.devices.requests[0].exactly"])
    )


@pytest.mark.parametrize(
    ("where", "key", "hint"),
    [
        ("request", "exactlyy", "did you mean exactly?"),
        ("exactly", "deviceClass", "did you mean deviceClassName?"),
        ("devices", "request", "did you mean requests?"),
    ],
)
def test_unknown_fields_are_refused_with_the_closest_name(where: str, key: str, hint: str) -> None:
    doc = ours()
    devices = doc["spec"]["devices"]
    request = devices["requests"][0]
    if where == "request":
        request[key] = request.pop("exactly")
        path = f"spec.devices.requests[0].{key}"
    elif where == "exactly":
        request["exactly"][key] = request["exactly"].pop("deviceClassName")
        path = f"spec.devices.requests[0].exactly.{key}"
    else:
        devices[key] = []
        path = f"spec.devices.{key}"
    errors, _ = issues(doc)
    assert hint in errors[path] and "the apiserver refuses it" in errors[path]


def test_a_request_with_both_or_neither_form_is_refused() -> None:
    doc = ours()
    doc["spec"]["devices"]["requests"][0]["firstAvailable"] = [
        {"name": "a", "deviceClassName": "cni.networking.x-k8s.io"}
    ]
    errors, _ = issues(doc)
    assert "sets exactly and firstAvailable" in errors["spec.devices.requests[0]"]


def pod(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def test_a_container_claim_must_name_a_pod_claim() -> None:
    doc = pod(
        resourceClaims=[{"name": "data", "resourceClaimTemplateName": "t"}],
        containers=[{"name": "a", "resources": {"claims": [{"name": "data"}, {"name": "dta"}]}}],
        initContainers=[{"name": "i", "resources": {"claims": [{"name": "nope"}]}}],
    )
    errors, _ = issues(doc)
    assert set(errors) == {
        "spec.containers[0].resources.claims[1].name",
        "spec.initContainers[0].resources.claims[0].name",
    }
    assert (
        "names no entry of the pod's resourceClaims (known: data)"
        in (errors["spec.containers[0].resources.claims[1].name"])
    )


def test_pod_claims_need_one_source_and_distinct_names() -> None:
    doc = pod(
        resourceClaims=[
            {"name": "a", "resourceClaimTemplateName": "t", "resourceClaimName": "c"},
            {"name": "a", "resourceClaimName": "c"},
        ],
        containers=[{"name": "x"}],
    )
    errors, _ = issues(doc)
    assert (
        "exactly one of resourceClaimName and resourceClaimTemplateName"
        in (errors["spec.resourceClaims[0]"])
    )
    assert "given twice" in errors["spec.resourceClaims[1].name"]


@pytest.mark.parametrize("kind", ["Pod", "Deployment"])
def test_multus_annotations_are_warned_of(kind: str) -> None:
    meta = {"name": "w", "annotations": {"k8s.v1.cni.cncf.io/networks": "macvlan-conf"}}
    spec = {"containers": [{"name": "a"}]}
    if kind == "Pod":
        doc = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
        path = 'metadata.annotations["k8s.v1.cni.cncf.io/networks"]'
    else:
        doc = {
            "apiVersion": "apps/v1",
            "kind": kind,
            "metadata": {"name": "w"},
            "spec": {"template": {"metadata": copy.deepcopy(meta), "spec": spec}},
        }
        path = 'spec.template.metadata.annotations["k8s.v1.cni.cncf.io/networks"]'
    errors, warnings = issues(doc)
    assert not errors
    assert "cnidra ignores it" in warnings[path] and "cnidra convert" in warnings[path]


@pytest.mark.parametrize("chained", ["tuning", "portmap", "bandwidth", "sbr"])
def test_a_chained_plugin_alone_in_a_conf_is_refused(chained: str) -> None:
    conf = {"cniVersion": "1.0.0", "name": "n", "type": chained}
    errors, _ = issues(params(conf))
    assert "only modifies an interface another plugin made" in errors["config.type"]


def test_a_cni_conf_file_is_validated_as_libcni_reads_it() -> None:
    [good, bad] = validate_documents(
        [
            {"cniVersion": "1.0.0", "name": "n", **MACVLAN},
            {"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "tuning"}]},
        ]
    )
    assert good.kind == "conf" and not good.issues.errors
    assert bad.kind == "conflist" and bad.issues.errors


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
_words = st.sampled_from(
    ["name", "exactly", "exactlyy", "firstAvailable", "deviceClassName", "count", "requests",
     "config", "opaque", "driver", "resourceClaims", "containers", "resources", "claims",
     "template", "spec", "metadata", "annotations", "k8s.v1.cni.cncf.io/networks"]
)  # fmt: skip
_shaped = st.recursive(
    _json,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_words, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["ResourceClaim", "ResourceClaimTemplate", "Pod", "Deployment"]),
    st.sampled_from(["resource.k8s.io/v1", "resource.k8s.io/v1beta1", "v1", "apps/v1"]),
    _shaped,
    st.none() | st.dictionaries(st.sampled_from([CLAIM_CONFIG_LABEL, "x"]), st.text(max_size=4)),
)
def test_any_shape_is_a_verdict_not_a_crash(
    kind: str, api_version: str, spec: Any, labels: dict[str, str] | None
) -> None:
    doc = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}, "spec": spec}
    [report] = validate_documents([doc], admission=Admission(labels, labels))
    assert all(str(i.path) and i.message for i in report.issues.items)
