"""`cnidra validate` and network policy (issue 43): which pods and interfaces each policy selects
among the input's Pods and workloads (their interfaces named as prepare names them, on the
network `policy-for` names), and the tenancy rule judged against the input's networks: a tenant
policy for another namespace's network is refused offline, as the driver refuses it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cnidra.api.validate import validate_documents
from cnidra.cli.main import app

DRIVER = "cni.dra.networking.x-k8s.io"
MACVLAN = {"cniVersion": "1.0.0", "type": "macvlan", "master": "eth1", "ipam": {"type": "static"}}


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def nad(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"config": json.dumps({**MACVLAN, "name": name})},
    }


def template(ns: str, name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "net", "exactly": {"deviceClassName": "cni.networking.x-k8s.io"}}
                    ],
                    "config": [
                        {
                            "requests": ["net"],
                            "opaque": {
                                "driver": DRIVER,
                                "parameters": {
                                    "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                                    "kind": "CNIConfig",
                                    **parameters,
                                },
                            },
                        }
                    ],
                }
            }
        },
    }


def pod(ns: str, name: str, claim: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "resourceClaims": [{"name": "n", "resourceClaimTemplateName": claim}],
            "containers": [{"name": "c", "image": "x"}],
        },
    }


def deployment(ns: str, name: str, claim: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": pod(ns, name, claim)["spec"],
            },
        },
    }


def mnp(ns: str, name: str, policy_for: str, selector: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1beta1",
        "kind": "MultiNetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": ns,
            "annotations": {"k8s.v1.cni.cncf.io/policy-for": policy_for},
        },
        "spec": {"podSelector": selector},
    }


ADMIN = {
    "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
    "kind": "CNIAdminNetworkPolicy",
    "metadata": {"name": "tenants"},
    "spec": {
        "priority": 1,
        "subject": {"namespaces": {"matchLabels": {"tier": "tenant"}}},
        "networks": ["tenant-a/blue", "claim:tenant-b/green"],
    },
}

INPUT = [
    namespace("tenant-a", tier="tenant"),
    namespace("tenant-b", tier="tenant"),
    nad("tenant-a", "blue"),
    template("tenant-a", "blue", {"network": {"attachmentDefinition": "blue"}}),
    template("tenant-b", "green", {"ifName": "data0", "config": {**MACVLAN, "name": "green"}}),
    pod("tenant-a", "db", "blue", app="db"),
    pod("tenant-a", "web", "blue", app="web"),
    deployment("tenant-b", "api", "green", app="api"),
    mnp("tenant-a", "db-only", "blue", {"matchLabels": {"app": "db"}}),
    mnp("tenant-b", "green", "claim:tenant-b/green", {}),
    ADMIN,
    mnp("tenant-b", "theirs", "claim:tenant-a/blue", {}),
    mnp("tenant-b", "their-nad", "tenant-a/blue", {}),
    mnp("tenant-b", "elsewhere", "cninetwork:not-here", {}),
]


def reports() -> dict[str, Any]:
    return {r.name: r for r in validate_documents(INPUT) if r.selects is not None}


def test_each_policy_says_which_pods_and_interfaces_of_the_input_it_selects() -> None:
    found = reports()
    assert found["db-only"].selects == [
        "Pod db tenant-a: net1 on tenant-a/blue (ResourceClaimTemplate blue request net)"
    ]
    assert found["green"].selects == [
        "Deployment api (its pods) tenant-b: data0 on claim:tenant-b/green "
        "(ResourceClaimTemplate green request net)"
    ]
    # the admin's: every pod of a tenant namespace on either network
    assert [s.split(":")[0] for s in found["tenants"].selects] == [
        "Pod db tenant-a",
        "Pod web tenant-a",
        "Deployment api (its pods) tenant-b",
    ]
    assert not found["db-only"].issues.items and not found["green"].issues.items


def test_a_tenant_policy_for_another_namespaces_network_is_refused_offline() -> None:
    found = reports()
    [claim] = found["theirs"].issues.errors
    assert str(claim.path) == 'metadata.annotations["k8s.v1.cni.cncf.io/policy-for"]'
    assert "a claim-defined network is its namespace's alone" in claim.message
    [nad_error] = found["their-nad"].issues.errors
    assert "pods of tenant-b may not use it" in nad_error.message
    assert "that no claim of tenant-b uses" in nad_error.message
    # a network the input does not hold: not judged, said so
    [unknown] = found["elsewhere"].issues.warnings
    assert "cninetwork:not-here: whether tenant-b may use it is not checked" in unknown.message
    assert not found["elsewhere"].issues.errors and found["elsewhere"].selects == []


def test_a_namespace_using_another_namespaces_nad_may_write_policy_for_it() -> None:
    lending = {  # the admin lets claims use tenant-a's NADs
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "cni.networking.x-k8s.io"},
        "spec": {
            "config": [
                {
                    "opaque": {
                        "driver": DRIVER,
                        "parameters": {
                            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                            "kind": "CNIPolicy",
                            "claims": {
                                "defineNetworks": True,
                                "plugins": ["macvlan", "static"],
                                "attachmentDefinitionNamespaces": ["tenant-a"],
                            },
                        },
                    }
                }
            ]
        },
    }
    docs = [
        *INPUT[:3],
        lending,
        template("tenant-b", "borrowed", {"network": {"attachmentDefinition": "tenant-a/blue"}}),
        pod("tenant-b", "client", "borrowed"),
        mnp("tenant-b", "their-nad", "tenant-a/blue", {}),
    ]
    [report] = [r for r in validate_documents(docs) if r.name == "their-nad"]
    assert not report.issues.items
    assert report.selects == [
        "Pod client tenant-b: net1 on tenant-a/blue (ResourceClaimTemplate borrowed request net)"
    ]


def test_validate_prints_the_selection_and_refuses_the_tenancy_breach(tmp_path: Path) -> None:
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(INPUT))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1, result.output
    assert "selects Pod db tenant-a: net1 on tenant-a/blue" in result.output
    assert "selects no interface of the input's pods" in result.output
    assert "a claim-defined network is its namespace's alone" in result.output
    as_json = CliRunner().invoke(app, ["validate", "-o", "json", str(path)])
    selections = {s["name"]: s["selects"] for s in json.loads(as_json.output)["selections"]}
    assert selections["db-only"] == [
        "Pod db tenant-a: net1 on tenant-a/blue (ResourceClaimTemplate blue request net)"
    ]


def test_a_namespace_document_is_read_for_its_labels_without_a_warning() -> None:
    [first, second] = [r for r in validate_documents(INPUT) if r.kind == "Namespace"]
    assert not first.issues.items and not second.issues.items


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "kind": st.sampled_from(
                    [
                        "Pod",
                        "Deployment",
                        "Namespace",
                        "DeviceClass",
                        "ResourceClaimTemplate",
                        "MultiNetworkPolicy",
                        "CNIAdminNetworkPolicy",
                    ]
                ),
                "metadata": JSON,
                "spec": JSON,
            }
        ),
        max_size=6,
    )
)
def test_any_input_is_judged_without_raising(docs: list[dict[str, Any]]) -> None:
    mixed: list[Any] = [*docs, *INPUT]
    reports = validate_documents(mixed)
    assert len(reports) == len(mixed)
