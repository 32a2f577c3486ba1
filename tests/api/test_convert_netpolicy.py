"""Issue 43: `cnidra convert` carries a Multus user's MultiNetworkPolicies over. cnidra reads the
same CRD and `policy-for`, so each is printed as written, except that a NAD whose config the
converted claims copy gets the claims' network (`claim:<ns>/<config name>`) added beside it,
and the converted pods are then selected, as `cnidra validate` shows; with `--reference` the
claims' interfaces are on the NADs and nothing changes. A policy cnidra would not apply is
refused with its errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from cnidra.api.convert import convert, read_all
from cnidra.api.validate import validate_documents
from cnidra.cli.main import app

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "convert" / "multus-deployment.yaml"
POLICY_FOR = "k8s.v1.cni.cncf.io/policy-for"


def mnp(name: str, policy_for: str, namespace: str = "telco") -> dict[str, Any]:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1beta1",
        "kind": "MultiNetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "annotations": {POLICY_FOR: policy_for}},
        "spec": {"podSelector": {"matchLabels": {"app": "upf"}}, "ingress": [{}]},
    }


def with_policies(*policies: dict[str, Any]) -> str:
    return EXAMPLE.read_text() + "\n---\n" + yaml.safe_dump_all(policies)


def test_a_workloads_policies_get_the_copied_networks_beside_their_nads() -> None:
    found = read_all(with_policies(mnp("data", "data"), mnp("both", "telco/storage, other/x")))
    out = convert(found.sources, found.workloads, network_policies=found.policies)
    assert not out.refused
    policies = [d for d in out.docs if d["kind"] == "MultiNetworkPolicy"]
    assert [p["metadata"]["annotations"][POLICY_FOR] for p in policies] == [
        "data, claim:telco/data",
        "telco/storage, other/x, claim:telco/storage",
    ]
    assert policies[0]["spec"] == mnp("data", "data")["spec"]  # the rest as written
    assert any("policy-for gets claim:telco/data beside the NADs" in n for n in out.notes)
    # what validate makes of the output: the converted Deployment's pods are selected
    reports = validate_documents(out.docs)
    [data] = [r for r in reports if r.name == "data" and r.kind == "MultiNetworkPolicy"]
    assert data.selects == [
        "Deployment upf (its pods) telco: n3 on claim:telco/data "
        "(ResourceClaimTemplate upf-networks request data)"
    ]
    assert not data.issues.errors


def test_with_reference_the_policies_are_carried_unchanged() -> None:
    text = (ROOT / "examples" / "convert" / "macvlan-nad.yaml").read_text()
    policy = mnp("m", "macvlan-conf")
    found = read_all(text + "\n---\n" + yaml.safe_dump(policy))
    out = convert(found.sources, reference=True, network_policies=found.policies)
    [carried] = [d for d in out.docs if d["kind"] == "MultiNetworkPolicy"]
    assert carried == policy
    assert any("carried over unchanged: the claims reference its NADs" in n for n in out.notes)


def test_policies_alone_are_carried_unchanged_and_an_invalid_one_is_refused(
    tmp_path: Path,
) -> None:
    bad = mnp("bad", "telco/data")
    bad["spec"]["ingress"] = [{"ports": [{"port": 0}]}]
    path = tmp_path / "policies.yaml"
    path.write_text(yaml.safe_dump_all([mnp("data", "data"), bad]))
    result = CliRunner().invoke(app, ["convert", "-o", "json", str(path)])
    assert result.exit_code == 1
    printed = json.loads(result.stdout)["items"]
    assert printed == [mnp("data", "data")]
    assert "carried over unchanged" in result.stderr
    assert "MultiNetworkPolicy telco/bad: cnidra would not apply it" in result.stderr
    assert "spec.ingress[0].ports[0].port" in result.stderr
