"""The chart follows the conventions operators expect of a chart they install (issue 41), checked
without a cluster: `helm lint --strict` with each of ci/'s values files (chart-testing's), every
rendered object carrying the standard labels and a name of its release's (but the cluster-wide
objects whose names are the API), the webhook's PodDisruptionBudget, PriorityClass, probes and
anti-affinity, digest pinning, values that could not take effect failing the render by name, the
schema refusing wrong values, and NOTES.txt telling nothing a packaged chart does not carry."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from cnidra.admission.webhook import _App
from cnidra.api.validate import validate_documents
from tests.test_chart import CHART, KUBE, chart_version, helm

DIGEST = "sha256:" + "0123456789abcdef" * 4
EVERYTHING = (
    "createNamespace=true",
    "admission.webhook.enabled=true",
    "admission.webhook.certManager.enabled=true",
    "metrics.annotations=true",
    "metrics.service.enabled=true",
    "metrics.serviceMonitor.enabled=true",
    "metrics.podMonitor.enabled=true",
    "metrics.dashboard.enabled=true",
    "cniPlugins.install=true",
    "deviceClasses.extra[0].name=data.cni.networking.x-k8s.io",
)
# Cluster-wide objects whose names are not the release's: one set per cluster, named by the API
# they are (claims name the DeviceClasses; docs and tests name the policies and the webhook's
# registration). A second release fails on them (Helm's ownership check), never shares them.
FIXED = {
    ("DeviceClass", "cni.networking.x-k8s.io"),
    ("DeviceClass", "cni-network.networking.x-k8s.io"),
    ("DeviceClass", "data.cni.networking.x-k8s.io"),
    ("ValidatingWebhookConfiguration", "cni.networking.x-k8s.io"),
    *(
        (kind, f"{policy}.cni.networking.x-k8s.io")
        for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
        for policy in ("claim-config", "device-classes", "node-scope", "pod-writes", "ipam-writes")
    ),
}


def template(
    *sets: str,
    release: str = "cnidra",
    namespace: str = "cnidra-system",
    chart: Path = CHART,
    only: str = "",
) -> subprocess.CompletedProcess[str]:
    args = [helm(), "template", release, str(chart), "--namespace", namespace]
    args += ["--kube-version", KUBE, *(f"--set={s}" for s in sets)]
    args += [f"--show-only={only}"] if only else []
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def rendered(*sets: str, release: str = "cnidra", namespace: str = "cnidra-system") -> list[Any]:
    out = template(*sets, release=release, namespace=namespace)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind]
    return doc


def pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod template of each workload, by its kind."""
    workloads = ("DaemonSet", "Deployment")
    return {d["kind"]: d["spec"]["template"] for d in docs if d["kind"] in workloads}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("values", sorted(p.name for p in (CHART / "ci").glob("*-values.yaml")))
def test_it_lints_strictly_with_each_ci_values_file(values: str) -> None:
    out = subprocess.run(
        [helm(), "lint", "--strict", str(CHART), "--kube-version", KUBE,
         "--values", str(CHART / "ci" / values)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_it_lints_strictly_with_every_option_on() -> None:
    out = subprocess.run(
        [helm(), "lint", "--strict", str(CHART), "--kube-version", KUBE,
         *(f"--set={s}" for s in EVERYTHING)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("release", ["cnidra", "edge"])
def test_every_object_and_pod_carries_the_standard_labels(release: str) -> None:
    docs = rendered(*EVERYTHING, release=release)
    labelled = [(f"{d['kind']}/{d['metadata']['name']}", d["metadata"]) for d in docs]
    labelled += [(f"the pods of a {kind}", p["metadata"]) for kind, p in pods(docs).items()]
    for what, meta in labelled:
        labels = meta.get("labels", {})
        where = f"{what}: {labels}"
        assert labels.get("app.kubernetes.io/name") in ("cnidra", "cnidra-webhook"), where
        assert labels.get("app.kubernetes.io/instance") == release, where
        assert labels.get("app.kubernetes.io/version") == chart_version(), where
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", where
        assert labels.get("helm.sh/chart") == f"cnidra-{chart_version()}", where
        assert labels.get("app.kubernetes.io/part-of") == "cnidra", where
        if what != "Namespace/cnidra-system":  # the namespace is the whole release's
            assert labels.get("app.kubernetes.io/component"), where


def test_a_releases_names_are_its_own_but_the_cluster_wide_apis() -> None:
    docs = rendered(*EVERYTHING, release="edge", namespace="net")
    named = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {n for n in named if not n[1].startswith("edge-cnidra")} == FIXED | {
        ("Namespace", "net")
    }
    assert all(d["metadata"].get("namespace", "net") == "net" for d in docs)
    # what refers to a name refers to the release's (labels aside: app.kubernetes.io/name)
    unlabelled = [{**d, "metadata": {**d["metadata"], "labels": {}}} for d in docs]
    for p in pods(unlabelled).values():
        p["metadata"]["labels"] = {}
    text = yaml.safe_dump_all(unlabelled)
    assert "system:serviceaccount:net:edge-cnidra" in text  # the admission policies' identity
    assert not re.search(r"\bcnidra-(webhook|logging|metrics)\b", text.replace("edge-cnidra", ""))
    hook = one(docs, "ValidatingWebhookConfiguration")
    assert hook["webhooks"][0]["clientConfig"]["service"]["name"] == "edge-cnidra-webhook"
    assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        "net/edge-cnidra-webhook"
    )
    assert one(docs, "Certificate")["spec"]["dnsNames"][0] == "edge-cnidra-webhook.net.svc"
    driver_pod, webhook_pod = pods(docs)["DaemonSet"], pods(docs)["Deployment"]
    assert driver_pod["spec"]["serviceAccountName"] == "edge-cnidra"
    assert webhook_pod["spec"]["serviceAccountName"] == "edge-cnidra-webhook"
    assert {"name": "logging", "configMap": {"name": "edge-cnidra-logging"}} in (
        driver_pod["spec"]["volumes"]
    )


@pytest.mark.parametrize("release", ["cnidra", "cnidra-prod"])
def test_a_release_whose_name_holds_the_charts_keeps_the_names_the_docs_give(release: str) -> None:
    """The test bed's release, `helm install cnidra`, and deploy/: the names of before issue 41
    (the DaemonSet cnidra, the Service cnidra-webhook ...); a release named cnidra-prod: the same
    with its name."""
    named = {
        (d["kind"], d["metadata"]["name"])
        for d in rendered("admission.webhook.enabled=true", "metrics.service.enabled=true",
                          release=release)
    }  # fmt: skip
    ours = {
        ("ServiceAccount", release), ("ClusterRole", release), ("ClusterRoleBinding", release),
        ("ConfigMap", f"{release}-logging"), ("DaemonSet", release),
        ("Service", f"{release}-metrics"), ("ServiceAccount", f"{release}-webhook"),
        ("ClusterRole", f"{release}-webhook"), ("ClusterRoleBinding", f"{release}-webhook"),
        ("Secret", f"{release}-webhook-tls"), ("Deployment", f"{release}-webhook"),
        ("Service", f"{release}-webhook"), ("PodDisruptionBudget", f"{release}-webhook"),
    }  # fmt: skip
    fixed = FIXED - {("DeviceClass", "data.cni.networking.x-k8s.io")}
    assert named == ours | fixed


def test_the_fullname_override_wins_and_long_names_fit() -> None:
    docs = rendered("admission.webhook.enabled=true", release="a" * 53)  # Helm's longest
    for d in docs:
        if d["kind"] == "Service":
            assert len(d["metadata"]["name"]) <= 63, d["metadata"]["name"]
    docs = rendered("fullnameOverride=net", release="edge")
    assert one(docs, "DaemonSet")["metadata"]["name"] == "net"


def test_driver_selectors_never_pick_the_webhooks_pods() -> None:
    """The DaemonSet's selector is immutable (the one of 0.2); the webhook's pods carry
    app.kubernetes.io/name cnidra-webhook, so neither it nor the metrics Service or the
    PodMonitor select them, and each selector picks its own pods."""
    docs = rendered(*EVERYTHING)
    driver, webhook = pods(docs)["DaemonSet"], pods(docs)["Deployment"]
    selectors = [one(docs, "DaemonSet")["spec"]["selector"]["matchLabels"],
                 one(docs, "PodMonitor")["spec"]["selector"]["matchLabels"]] + [
        d["spec"]["selector"] for d in docs if d["kind"] == "Service"
        and d["metadata"]["name"] == "cnidra-metrics"
    ]  # fmt: skip
    assert selectors[0] == {
        "app.kubernetes.io/name": "cnidra",
        "app.kubernetes.io/instance": "cnidra",
    }
    for selector in selectors:
        assert selects(selector, driver["metadata"]["labels"]), selector
        assert not selects(selector, webhook["metadata"]["labels"]), selector
    webhook_selectors = [
        one(docs, "Deployment")["spec"]["selector"]["matchLabels"],
        one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        *(
            d["spec"]["selector"]
            for d in docs
            if d["kind"] == "Service" and d["metadata"]["name"] == "cnidra-webhook"
        ),
    ]
    assert len(webhook_selectors) == 3
    assert webhook_selectors[0] == {"app": "cnidra-webhook"}  # the Deployment's of 0.2
    for selector in webhook_selectors:
        assert selects(selector, webhook["metadata"]["labels"]), selector
        assert not selects(selector, driver["metadata"]["labels"]), selector


def test_the_webhook_has_a_budget_priority_probes_and_spreads() -> None:
    docs = rendered("admission.webhook.enabled=true")
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    pod = pods(docs)["Deployment"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pods(docs)["DaemonSet"]["spec"]["priorityClassName"] == "system-node-critical"
    [container] = pod["containers"]
    assert {"containerPort": 9443, "name": "https"} in container["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {
            "path": "/healthz",
            "port": "https",
            "scheme": "HTTPS",
        }
    [term] = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {
        "labelSelector": {"matchLabels": {"app": "cnidra-webhook"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https"}]


def test_the_probes_path_is_one_the_webhook_serves() -> None:
    """GET /healthz answers 200 from cnidra's webhook application itself (the probes' path)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    def never(_: str) -> None:
        raise AssertionError("a health check looks nothing up")

    app = _App(never, never, workers=1)
    try:
        for path, status in (("/healthz", 200), ("/readyz", 404)):
            sent.clear()
            scope = {"type": "http", "method": "GET", "path": path}
            asyncio.run(app(scope, receive, send))
            assert sent[0]["status"] == status, path
    finally:
        app.pool.shutdown()


def test_the_webhooks_placement_is_configurable() -> None:
    hard = pods(rendered("admission.webhook.enabled=true", "admission.webhook.podAntiAffinity=hard",
                         "admission.webhook.priorityClassName=", "admission.webhook.replicas=3",
                         "admission.webhook.nodeSelector.role=infra",
                         "admission.webhook.podDisruptionBudget.maxUnavailable=50%",
                         "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                         ".nodeSelectorTerms[0].matchExpressions[0].key=net",
                         "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                         ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists"))  # fmt: skip
    spec = hard["Deployment"]["spec"]
    assert set(spec["affinity"]) == {"nodeAffinity", "podAntiAffinity"}
    assert "requiredDuringSchedulingIgnoredDuringExecution" in spec["affinity"]["podAntiAffinity"]
    assert "priorityClassName" not in spec and spec["nodeSelector"] == {"role": "infra"}
    assert "podAntiAffinity" not in hard["DaemonSet"]["spec"]["affinity"]  # the webhook's only
    docs = rendered("admission.webhook.enabled=true", "admission.webhook.podAntiAffinity=none",
                    "admission.webhook.podDisruptionBudget.enabled=false",
                    "priorityClassName=")  # fmt: skip
    assert "affinity" not in pods(docs)["Deployment"]["spec"]
    assert "priorityClassName" not in pods(docs)["DaemonSet"]["spec"]
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]


def test_a_digest_pins_every_container() -> None:
    docs = rendered("image.digest=" + DIGEST, "admission.webhook.enabled=true",
                    "cniPlugins.install=true")  # fmt: skip
    images = {
        c["image"]
        for p in pods(docs).values()
        for c in p["spec"].get("initContainers", []) + p["spec"]["containers"]
    }
    assert images == {f"cnidra@{DIGEST}"}
    assert {c["image"] for c in pods(rendered())["DaemonSet"]["spec"]["containers"]} == {
        f"cnidra:{chart_version()}"
    }


@pytest.mark.parametrize(
    ("sets", "named"),
    [
        (["admission.webhook.certManager.enabled=true"],
         ["admission.webhook.certManager.enabled", "admission.webhook.enabled"]),
        (["image.tag=0.2.0", f"image.digest={DIGEST}"], ["image.digest", "image.tag"]),
        (["cniPlugins.overwrite=true"], ["cniPlugins.overwrite", "cniPlugins.install"]),
        (["apiServer.host=10.0.0.1"], ["apiServer.host", "apiServer.port"]),
        (["apiServer.port=6443"], ["apiServer.host", "apiServer.port"]),
        (["admission.webhook.enabled=true", "affinity.podAntiAffinity.x=y"],
         ["affinity.podAntiAffinity", "admission.webhook.podAntiAffinity"]),
        (["metrics.service.annotations.a=b"],
         ["metrics.service.annotations", "metrics.service.enabled"]),
        (["metrics.serviceMonitor.labels.release=prom"],
         ["metrics.serviceMonitor.labels", "metrics.serviceMonitor.enabled"]),
        (["metrics.podMonitor.labels.release=prom"],
         ["metrics.podMonitor.labels", "metrics.podMonitor.enabled"]),
        (["metrics.dashboard.namespace=grafana"],
         ["metrics.dashboard.namespace", "metrics.dashboard.enabled"]),
    ],
)  # fmt: skip
def test_a_value_that_could_not_take_effect_fails_naming_it(
    sets: list[str], named: list[str]
) -> None:
    out = template(*sets)
    assert out.returncode != 0, f"{sets} rendered"
    assert "execution error" in out.stderr and all(n in out.stderr for n in named), out.stderr


def test_the_same_values_with_what_they_need_render() -> None:
    rendered("admission.webhook.enabled=true", "admission.webhook.certManager.enabled=true",
             f"image.digest={DIGEST}", "cniPlugins.install=true", "cniPlugins.overwrite=true",
             "apiServer.host=10.0.0.1", "apiServer.port=6443",
             "admission.webhook.podAntiAffinity=none", "affinity.podAntiAffinity.x=y",
             "metrics.service.enabled=true", "metrics.service.annotations.a=b",
             "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom",
             "metrics.podMonitor.enabled=true", "metrics.podMonitor.labels.release=prom",
             "metrics.dashboard.enabled=true", "metrics.dashboard.namespace=grafana")  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [
        "image.digest=sha256:abc",
        "image.digest=latest",
        "admission.webhook.podDisruptionBudget.maxUnavailable=0",
        "admission.webhook.podDisruptionBudget.maxUnavailable=0%",
        "admission.webhook.podDisruptionBudget.maxUnavailable=half",
        "admission.webhook.podDisruptionBudget.surprise=1",
        "admission.webhook.podAntiAffinity=maybe",
        "admission.webhook.priorityClassName=Not_A_Name",
        "priorityClassName=Critical!",
        "admission.webhook.replicas=0",
        "admission.webhook.failurePolicy=Sometimes",
        "admission.webhook.nodeSelector.role=null",
        "admission.webhook.certManager.issuer=x",
        "fullnameOverride=Net_Driver",
        "nameOverride=" + "n" * 56,
        "apiServer.port=https",
        "apiServer.port=70000",
        "metrics.serviceMonitor.labels.release=null",
        "image.repository=",
    ],
)
def test_the_schema_refuses_wrong_values(bad: str) -> None:
    out = template(bad)
    assert out.returncode != 0 and "values don't meet the specifications" in out.stderr, (
        bad + ": " + out.stderr
    )


def notes(tmp_path: Path, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it (which needs a cluster): rendered by `tpl` in a
    copy of the chart, with the same values and helpers."""
    chart = tmp_path / "cnidra"
    shutil.copytree(CHART, chart)
    (chart / "notes.txt").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}}\n'
    )
    out = template(*sets, chart=chart, only="templates/zz-notes.yaml")
    assert out.returncode == 0, out.stderr
    text: str = yaml.safe_load(out.stdout)["data"]["notes"]
    return text


def test_the_notes_example_is_inline_and_valid(tmp_path: Path) -> None:
    text = notes(tmp_path)
    assert "examples/" not in text.replace("under examples/, which this chart does not carry", "")
    assert "rollout status daemonset/cnidra" in text and "WARNING" not in text
    [example] = re.findall(r"<<'EOF'\n(.*?)\nEOF\n", text, re.S)  # a heredoc ends unindented
    claim = yaml.safe_load(textwrap.dedent(example))
    assert claim["kind"] == "ResourceClaimTemplate"
    classes = [d for d in rendered() if d["kind"] == "DeviceClass"]
    [report] = validate_documents([claim], classes)
    assert not report.issues.errors, report.issues.errors


def test_the_notes_warn_of_a_lone_webhook_replica_under_fail(tmp_path: Path) -> None:
    text = notes(tmp_path, "admission.webhook.enabled=true", "admission.webhook.replicas=1",
                 "deviceClasses.default.create=false")  # fmt: skip
    assert "WARNING: one replica under failurePolicy Fail" in text
    assert "<<'EOF'" not in text  # no default class: no example using it
