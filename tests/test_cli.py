"""The `cnidra` command as users run it: a subprocess, exit codes and output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[1]
EXAMPLES = ROOT / "examples"


def cnidra(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cnidra", *args],
        input=stdin,
        text=True,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_validate_examples_are_valid() -> None:
    files = [str(p) for p in sorted(EXAMPLES.glob("*.yaml"))]
    result = cnidra("validate", *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_validate_json_output_for_the_design_review_example() -> None:
    result = cnidra("validate", "-o", "json", str(EXAMPLES / "invalid" / "design-review.yaml"))
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["valid"] is False
    # bridge ignores master (a warning), and the claim's DeviceClass is not in the input, so
    # its policy is not checked (a warning that says so)
    warnings = {w["path"].rsplit(".", 1)[-1]: w["message"] for w in report["warnings"]}
    assert "which ignores it" in warnings["master"]
    assert "is not checked (give the class with --policy FILE)" in warnings["requests[0]"]
    assert {e["path"].rsplit(".", 1)[1] for e in report["errors"]} == {"hairpinMode", "vlan"}
    assert all(e["document"] == 0 for e in report["errors"])


def test_validate_usage_errors_exit_2() -> None:
    assert cnidra("validate", "/nonexistent.yaml").returncode == 2
    not_yaml = cnidra("validate", "-", stdin="a: [b\n")
    # a file that is not YAML is an invalid input (exit 1, said like any other error)
    assert not_yaml.returncode == 1 and "not YAML" in not_yaml.stdout
    assert cnidra("validate", "-o", "xml", "-").returncode == 2


def test_multi_document_indexes() -> None:
    text = (
        (ROOT / "deploy" / "deviceclass.yaml").read_text()
        + "---\n"
        + (EXAMPLES / "invalid" / "design-review.yaml").read_text()
    )
    report = json.loads(cnidra("validate", "-o", "json", "-", stdin=text).stdout)
    classes = len(list(yaml.safe_load_all((ROOT / "deploy" / "deviceclass.yaml").read_text())))
    assert {e["document"] for e in report["errors"]} == {classes}  # the document after them


def test_convert_output_validates_and_round_trips() -> None:
    src = EXAMPLES / "convert" / "bridge.conflist"
    out = cnidra("convert", str(src), "--name", "storage-net", "--if-name", "stor0")
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    params = doc["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params["config"] == json.loads(src.read_text()) and params["ifName"] == "stor0"
    assert cnidra("validate", "-", stdin=out.stdout).returncode == 0


def test_convert_rejects_non_cni_input_with_exit_2() -> None:
    out = cnidra("convert", "-", stdin='{"hello": "world"}')
    assert out.returncode == 2 and "not a CNI config" in out.stderr


def test_unbounded_input_is_an_answer_not_a_traceback(tmp_path: Path) -> None:
    """A deeply nested .json file used to kill `cnidra validate` with a segmentation fault, and a
    JSON-string config 10,000 levels deep or with a 5,000-digit number with a traceback."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    example = (ROOT / "examples" / "two-networks-claim.yaml").read_text()
    [claim] = [d for d in yaml.safe_load_all(example) if d["kind"] == "ResourceClaim"]
    params = claim["spec"]["devices"]["config"][1]["opaque"]["parameters"]
    strings = tmp_path / "strings.yaml"
    docs = []
    for i, text in enumerate(["[" * 10_000 + "]" * 10_000, '{"mtu": ' + "9" * 5000 + "}"]):
        params["config"] = text
        claim["metadata"]["name"] = f"c{i}"
        docs.append(yaml.safe_dump(claim))
    strings.write_text("---\n".join(docs))
    for path, expected in ((deep, "nested more than"), (strings, "opaque.parameters")):
        result = cnidra(
            "validate", "--policy", str(ROOT / "deploy" / "deviceclass.yaml"), str(path)
        )
        assert result.returncode == 1, result.stdout + result.stderr
        assert expected in result.stdout and "Traceback" not in result.stderr, result.stderr


def test_webhook_wrong_input_is_a_usage_error(tmp_path: Path) -> None:
    cert = tmp_path / "tls.crt"
    cert.write_text("x")
    cases = [
        ("--tls-cert", "/nonexistent", "--tls-key", str(cert)),
        ("--tls-cert", str(cert), "--tls-key", str(cert), "--address", "nowhere"),
        ("--tls-cert", str(cert), "--tls-key", str(cert), "--kubeconfig", "/nonexistent"),
    ]
    for args in cases:
        result = cnidra("webhook", *args)
        assert result.returncode == 2, result.stderr
        assert "error:" in result.stderr and "Traceback" not in result.stderr, result.stderr


def claim_doc(name: str, request: dict[str, object], if_name: str = "net1") -> dict[str, object]:
    params = {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIConfig",
        "ifName": if_name,
        "config": {"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "macvlan"}]},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "net", "exactly": request}],
                    "config": [
                        {
                            "requests": ["net"],
                            "opaque": {
                                "driver": "cni.dra.networking.x-k8s.io",
                                "parameters": params,
                            },
                        }
                    ],
                }
            }
        },
    }


def test_validate_refuses_what_prepare_and_the_cluster_will(tmp_path: Path) -> None:
    """count 2 (prepare refuses it), a misspelled class when the classes are given (the
    closest is named), another driver's claim skipped, not "ok"."""
    gpu = {"deviceClassName": "gpu.example.com"}
    docs = [
        claim_doc("two", {"deviceClassName": "cni.networking.x-k8s.io", "count": 2}),
        claim_doc("typo", {"deviceClassName": "cni.networking.k8s.io"}),
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "gpu"},
         "spec": {"devices": {"requests": [{"name": "g", "exactly": gpu}]}}},
    ]  # fmt: skip
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    policy = str(ROOT / "deploy" / "deviceclass.yaml")
    out = cnidra("validate", "-o", "json", "--policy", policy, str(path))
    assert out.returncode == 1
    report = json.loads(out.stdout)
    errors = {e["name"]: e for e in report["errors"]}
    assert errors["two"]["path"].endswith("exactly.count")
    assert "did you mean cni.networking.x-k8s.io?" in errors["typo"]["message"]
    assert [s["name"] for s in report["skipped"]] == ["gpu"]


def test_validate_json_is_one_document_even_with_a_missing_file(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(claim_doc("ok", {"deviceClassName": "cni.networking.x-k8s.io"})))
    empty = tmp_path / "empty"
    empty.mkdir()
    out = cnidra("validate", "-o", "json", str(good), "/nonexistent.yaml", str(empty))
    assert out.returncode == 2
    report = json.loads(out.stdout)
    assert {e["file"] for e in report["errors"]} == {"/nonexistent.yaml", str(empty)}


def test_validate_reads_a_directory_as_kubectl_apply_does(tmp_path: Path) -> None:
    """A directory stands for its .yaml, .yml and .json files (docs/upgrading.md's
    `cnidra validate --policy ... my-claims/`); other files in it are not read."""
    claims = tmp_path / "my-claims"
    claims.mkdir()
    ours = {"deviceClassName": "cni.networking.x-k8s.io"}
    (claims / "a.yaml").write_text(yaml.safe_dump(claim_doc("a", ours)))
    (claims / "b.yml").write_text(yaml.safe_dump(claim_doc("b", {**ours, "count": 2})))
    (claims / "notes.txt").write_text("not: [yaml")
    out = cnidra("validate", "-o", "json", str(claims))
    assert out.returncode == 1, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert {e["file"] for e in report["errors"]} == {str(claims / "b.yml")}


def test_validate_takes_a_kubectl_list_and_judges_files_together(tmp_path: Path) -> None:
    """A Pod in one file and its two templates in another, both naming net1: the clash is
    found across files; a `kind: List` stands for its items."""
    templates = tmp_path / "templates.yaml"
    ours = {"deviceClassName": "cni.networking.x-k8s.io"}
    listed = {"apiVersion": "v1", "kind": "List", "items": [claim_doc(n, ours) for n in "ab"]}
    templates.write_text(yaml.safe_dump(listed))
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"resourceClaims": [{"name": "x", "resourceClaimTemplateName": "a"},
                                    {"name": "y", "resourceClaimTemplateName": "b"}],
                 "containers": [{"name": "c", "image": "i"}]}}))  # fmt: skip
    alone = cnidra("validate", "-o", "json", str(templates))
    assert alone.returncode == 0, alone.stdout
    together = cnidra("validate", "-o", "json", str(pod), str(templates))
    assert together.returncode == 1
    [error] = json.loads(together.stdout)["errors"]
    assert error["file"] == str(pod) and "net1" in error["message"]


def test_a_wrong_request_name_does_not_hide_the_configs_other_problems(tmp_path: Path) -> None:
    doc = claim_doc("rounds", {"deviceClassName": "cni.networking.x-k8s.io"}, if_name="bad name!")
    devices = doc["spec"]["spec"]["devices"]  # type: ignore[index]
    devices["config"][0]["requests"] = ["nett"]
    devices["config"][0]["opaque"]["parameters"]["config"]["plugins"][0].update(
        mode="sideways", mtu="x"
    )
    path = tmp_path / "rounds.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = cnidra("validate", "-o", "json", str(path))
    ends = sorted(e["path"].rsplit(".", 1)[-1] for e in json.loads(out.stdout)["errors"])
    assert ends == ["ifName", "mode", "mtu", "requests[0]"], ends


def test_the_driver_without_an_apiserver_config_says_where_it_looked(tmp_path: Path) -> None:
    """A new user running `cnidra driver` outside a pod, or with a broken kubeconfig: one line
    naming the config and what to give, exit 2, no traceback, nothing left behind."""
    broken = tmp_path / "kubeconfig"
    broken.write_text("clusters: [")
    state = tmp_path / "state"
    for extra, where in (
        ([], "in-cluster service account"),
        (["--kubeconfig", str(tmp_path / "missing")], "--kubeconfig"),
        (["--kubeconfig", str(broken)], "--kubeconfig"),
    ):
        result = cnidra("driver", "--node-name", "n1", "--state-dir", str(state), *extra)
        assert result.returncode == 2, result.stderr
        assert "no apiserver config" in result.stderr and where in result.stderr
        assert "Traceback" not in result.stderr
        assert not state.exists()
