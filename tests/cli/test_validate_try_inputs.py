"""`cnidra validate` and `cnidra try` on the inputs issue 41 named: the namespace label given
with --namespace-labels (a malformed one is a usage error naming the flag), CNI conf files read
as strict JSON, `try --policy` refusing what prepare refuses and `try` saying what it cannot
run. The `try` cases here all stop before any namespace is made (no root, no netns)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cnidra.api.validate import CLAIM_CONFIG_LABEL
from cnidra.cli.main import parse_labels

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
POLICY = str(ROOT / "deploy" / "deviceclass.yaml")


def cnidra(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cnidra", *args],
        text=True,
        capture_output=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


# ---------------------------------------------------------------- --namespace-labels

_NAME = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?", fullmatch=True)
_PREFIX = st.from_regex(r"[a-z0-9]{1,10}(\.[a-z0-9]{1,10}){0,2}", fullmatch=True)
_KEY = st.one_of(_NAME, st.builds(lambda p, n: f"{p}/{n}", _PREFIX, _NAME))


@settings(deadline=None)
@given(st.dictionaries(_KEY, st.one_of(st.just(""), _NAME), max_size=5))
def test_well_formed_labels_are_read_back(labels: dict[str, str]) -> None:
    text = ",".join(f"{k}={v}" for k, v in labels.items())
    assert parse_labels(text) == labels


@settings(max_examples=300, deadline=None)  # the first error imports rich
@given(st.text(max_size=40))
def test_any_text_is_labels_or_a_usage_error_naming_the_flag(text: str) -> None:
    try:
        labels = parse_labels(text)
    except typer.Exit as exc:
        assert exc.exit_code == 2
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())


@pytest.mark.parametrize(
    ("flag", "fragment"),
    [
        ("foo", "'foo': not KEY=VALUE"),
        ("a=b,c", "'c': not KEY=VALUE"),
        ("-a=b", "is not a label key"),
        ("Team.X/a=b", "is not a label key"),
        ("a=b c", "is not a label value"),
        ("a=b,a=c", "given twice"),
    ],
)
def test_malformed_namespace_labels_are_a_usage_error(flag: str, fragment: str) -> None:
    out = cnidra("validate", "--namespace-labels", flag, str(EXAMPLES / "macvlan-claim.yaml"))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--namespace-labels" in out.stderr and fragment in out.stderr
    assert "KEY=VALUE" in out.stderr and "Traceback" not in out.stderr


def test_the_label_the_shipped_admission_needs_is_judged() -> None:
    """docs/security.md: `cnidra validate --policy deviceclasses.yaml [--namespace-labels
    k=v]` gives the cluster's verdict offline, the claim-config label included."""
    claim = str(EXAMPLES / "macvlan-claim.yaml")
    without = cnidra("validate", "-o", "json", "--policy", POLICY, claim)
    assert without.returncode == 0, without.stdout
    [warning] = [w for w in json.loads(without.stdout)["warnings"] if "label" in w["message"]]
    assert f"{CLAIM_CONFIG_LABEL}=true" in warning["message"]
    unlabelled = cnidra(
        "validate", "-o", "json", "--policy", POLICY, "--namespace-labels", "team=a", claim
    )
    assert unlabelled.returncode == 1
    [error] = json.loads(unlabelled.stdout)["errors"]
    assert error["path"] == "spec.spec.devices.config"
    assert "namespace default may not carry" in error["message"]
    labelled = cnidra(
        "validate", "--policy", POLICY, "--namespace-labels", f"{CLAIM_CONFIG_LABEL}=true", claim
    )
    assert labelled.returncode == 0, labelled.stdout


def test_the_admin_class_annotation_is_judged_when_given() -> None:
    claim = str(EXAMPLES / "sriov-vf.yaml")
    label = ("--namespace-labels", f"{CLAIM_CONFIG_LABEL}=true")
    annotation = "cni.networking.x-k8s.io/device-classes"
    refused = cnidra("validate", "-o", "json", *label, "--namespace-annotation",
                     f"{annotation}=other.cni.networking.x-k8s.io", claim)  # fmt: skip
    assert refused.returncode == 1, refused.stdout
    assert "may not use DeviceClass(es) sriov-vf.cni.networking.x-k8s.io" in refused.stdout
    allowed = cnidra("validate", *label, "--namespace-annotation",
                     f"{annotation}=a.cni.networking.x-k8s.io,sriov-vf.cni.networking.x-k8s.io",
                     claim)  # fmt: skip
    assert allowed.returncode == 0, allowed.stdout
    wrong = cnidra("validate", "--namespace-annotation", "no-equals", claim)
    assert wrong.returncode == 2 and "--namespace-annotation 'no-equals'" in wrong.stderr


# ---------------------------------------------------------------- CNI conf files

CONF = '{"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "master": "eth1"%s}\n'


@pytest.mark.parametrize("name", ["net.conf", "net.json", "from-stdin"])
def test_a_trailing_comma_is_refused_as_libcni_refuses_it(tmp_path: Path, name: str) -> None:
    text = CONF % ","
    if name == "from-stdin":
        out = subprocess.run(
            [sys.executable, "-m", "cnidra", "validate", "-"],
            input=text,
            text=True,
            capture_output=True,
            cwd=ROOT,
            timeout=60,
            check=False,
        )
    else:
        path = tmp_path / name
        path.write_text(text)
        out = cnidra("validate", str(path))
    assert out.returncode == 1, out.stdout
    assert "is not JSON" in out.stdout and "trailing comma" in out.stdout


def test_a_good_conf_file_is_validated(tmp_path: Path) -> None:
    path = tmp_path / "net.conflist"
    path.write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "tuning"}]})
    )
    out = cnidra("validate", "-o", "json", str(path))
    assert out.returncode == 1
    [error] = json.loads(out.stdout)["errors"]
    assert error["kind"] == "conflist" and "tuning only modifies" in error["message"]
    path = tmp_path / "good.conf"
    path.write_text(CONF % "")
    assert cnidra("validate", str(path)).returncode == 0


def test_a_yaml_flow_mapping_is_still_yaml(tmp_path: Path) -> None:
    path = tmp_path / "claim.yaml"
    docs = list(yaml.safe_load_all((EXAMPLES / "macvlan-claim.yaml").read_text()))
    path.write_text("\n---\n".join(yaml.safe_dump(d, default_flow_style=True) for d in docs))
    out = cnidra("validate", str(path))
    assert out.returncode == 0, out.stdout + out.stderr


# ---------------------------------------------------------------- try


def readme_claim() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((EXAMPLES / "macvlan-claim.yaml").read_text()))


def write(tmp_path: Path, docs: list[dict[str, Any]]) -> str:
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def test_try_refuses_a_misspelt_exactly_before_running_anything(tmp_path: Path) -> None:
    docs = readme_claim()
    for doc in docs:
        if doc["kind"] == "ResourceClaimTemplate":
            request = doc["spec"]["spec"]["devices"]["requests"][0]
            request["exactlyy"] = request.pop("exactly")
    out = cnidra("try", write(tmp_path, docs))
    assert out.returncode == 1
    assert "exactlyy" in out.stderr and "did you mean exactly?" in out.stderr
    assert out.stdout == "" and "ADD" not in out.stderr


def test_try_policy_refuses_what_prepare_refuses(tmp_path: Path) -> None:
    """The claim's pool does not serve its namespace: prepare refuses it, so try --policy
    does too, before any plugin runs."""
    docs = readme_claim()
    for doc in docs:
        if doc["kind"] in ("ResourceClaimTemplate", "Pod"):
            doc["metadata"]["namespace"] = "team-b"
    out = cnidra("try", "--policy", POLICY, write(tmp_path, docs))
    assert out.returncode == 1, out.stderr
    assert "refused:" in out.stderr and "does not serve namespace team-b" in out.stderr
    assert "prepare refuses it (nothing was run)" in out.stderr and "ADD" not in out.stderr


def test_try_policy_refuses_what_the_class_does_not_allow(tmp_path: Path) -> None:
    docs = readme_claim()
    for doc in docs:
        if doc["kind"] == "ResourceClaimTemplate":
            params = doc["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
            params["config"]["plugins"][0]["ipam"] = {"type": "host-local", "subnet": "10.9.0.0/24"}
    path = write(tmp_path, docs)
    out = cnidra("try", "--policy", POLICY, path)
    assert out.returncode == 1 and "host-local written by a claim is refused" in out.stderr
    assert "ADD" not in out.stderr


def test_try_says_plainly_it_cannot_run_a_pool_it_was_not_given(tmp_path: Path) -> None:
    docs = [d for d in readme_claim() if d["kind"] != "CNIIPPool"]
    out = cnidra("try", write(tmp_path, docs))
    assert out.returncode == 2
    assert "cannot run request 'macvlan'" in out.stderr
    assert "`ipam: {type: cnidra}` is no plugin" in out.stderr
    assert "failed to find plugin" not in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--namespace-labels", "x"], "--namespace-labels 'x': not KEY=VALUE"),
        (["--policy", "/nonexistent.yaml"], "/nonexistent.yaml does not exist"),
    ],
)
def test_try_usage_errors(tmp_path: Path, args: list[str], fragment: str) -> None:
    out = cnidra("try", *args, write(tmp_path, readme_claim()))
    assert out.returncode == 2 and fragment in out.stderr and "Traceback" not in out.stderr
