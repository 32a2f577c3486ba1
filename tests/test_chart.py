"""The Helm chart with a real helm (built from the Go module proxy, cached): it lints, renders
with its defaults and with every option on, refuses values its schema does not allow, renders
manifests cnidra accepts (its DeviceClasses validate; the driver knows every flag it passes),
and deploy/ is exactly what it renders (one source)."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from cnidra.api.validate import validate_documents
from testbed.harness import helm as build_helm
from tests.conftest import cache_lock

ROOT = Path(__file__).parents[1]


@cache
def helm() -> str:
    """Built once into the cache (one build at a time: pytest-xdist's workers each ask)."""
    with cache_lock("install-helm"):
        return build_helm()


CHART = ROOT / "charts" / "cnidra"
KUBE = "v1.37.2"


def render(*sets: str) -> subprocess.CompletedProcess[str]:
    args = [helm(), "template", "cnidra", str(CHART), "--namespace", "cnidra-system"]
    args += ["--kube-version", KUBE, *(f"--set={s}" for s in sets)]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def docs(*sets: str) -> list[dict[str, Any]]:
    out = render(*sets)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def chart_version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def test_the_chart_lints() -> None:
    out = subprocess.run(
        [helm(), "lint", "--strict", str(CHART), "--kube-version", KUBE],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_defaults_and_every_option_render() -> None:
    kinds = sorted(d["kind"] for d in docs())
    assert kinds.count("DaemonSet") == 1 and "ValidatingAdmissionPolicy" in kinds
    everything = docs(
        "admission.webhook.enabled=true",
        "metrics.annotations=true",
        "driver.publishNodeLinks={eth1}",
        "hostPaths.extraCNIBin={/usr/libexec/cni,/var/lib/cni/bin}",
        "cniPlugins.install=true",
        "deviceClasses.extra[0].name=data.cni.networking.x-k8s.io",
        "deviceClasses.extra[0].selectors[0]="
        'device.attributes["cni.dra.networking.x-k8s.io"].ifName == "ens2f0"',
    )
    [pod] = [d["spec"]["template"]["spec"] for d in everything if d["kind"] == "DaemonSet"]
    [driver] = pod["containers"]
    assert "--cdi-dir=/var/run/cdi" in driver["args"]  # device metadata: where the runtime reads
    assert {"name": "cdi", "mountPath": "/var/run/cdi"} in driver["volumeMounts"]
    install, _ = pod["initContainers"]  # the bundled plugins onto the node, then the migration
    assert install["command"][:2] == ["cnidra", "install-cni-plugins"]
    assert install["image"] == driver["image"] == f"cnidra:{chart_version()}-cni-plugins"
    assert "--cni-path=/opt/cni/bin:/opt/cni/bin-extra/0:/opt/cni/bin-extra/1" in driver["args"]
    assert {"name": "cni-bin-extra-1", "mountPath": "/opt/cni/bin-extra/1", "readOnly": True} in (
        driver["volumeMounts"]
    )
    webhook = next(d for d in everything if d["kind"] == "ValidatingWebhookConfiguration")
    assert webhook["webhooks"][0]["clientConfig"]["caBundle"]  # the certificate made at install
    assert [d["metadata"]["name"] for d in everything if d["kind"] == "DeviceClass"] == [
        "cni.networking.x-k8s.io",
        "data.cni.networking.x-k8s.io",
        "cni-network.networking.x-k8s.io",
    ]


@pytest.mark.parametrize(
    "bad",
    [
        "driver.logLevel=loud",
        "hostPaths.state=relative/path",
        "image.pullPolicy=Sometimes",
        "driver.nope=1",
        "driver.normalEvents=true",  # a boolean before issue 42's added, all, none
        "driver.normalEvents=false",
    ],
)
def test_the_schema_refuses_bad_values(bad: str) -> None:
    out = render(bad)
    assert out.returncode != 0 and "values don't meet the specifications" in out.stderr, out.stderr
    if bad.startswith("driver.normalEvents"):
        assert "/driver/normalEvents': got boolean, want string" in out.stderr, out.stderr


def test_what_it_renders_cnidra_accepts() -> None:
    rendered = docs()
    classes = [d for d in rendered if d["kind"] == "DeviceClass"]
    assert all(not r.issues.errors for r in validate_documents(classes))
    [daemonset] = [d for d in rendered if d["kind"] == "DaemonSet"]
    driver = daemonset["spec"]["template"]["spec"]["containers"][0]
    known = subprocess.run(
        ["cnidra", "driver", "--help"], capture_output=True, text=True, check=True, timeout=60,
        env={"COLUMNS": "200", "PATH": str(ROOT / ".venv" / "bin")},
    ).stdout  # fmt: skip
    for arg in driver["args"]:
        assert arg.split("=", 1)[0] in known, arg


def test_deploy_is_what_the_chart_renders() -> None:
    before = {p.name: p.read_text() for p in (ROOT / "deploy").glob("*.yaml")}
    subprocess.run(
        [ROOT / "hack" / "render-deploy.sh"], check=True, timeout=300, capture_output=True
    )
    after = {p.name: p.read_text() for p in (ROOT / "deploy").glob("*.yaml")}
    assert after == before, "deploy/ differs from the chart: run `make deploy` and commit"


def test_helm_template_needs_no_flags_and_an_old_cluster_is_named() -> None:
    bare = subprocess.run(
        [helm(), "template", "cnidra", str(CHART)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bare.returncode == 0, bare.stderr
    old = subprocess.run(
        [helm(), "template", "cnidra", str(CHART), "--kube-version", "v1.33.4"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert old.returncode != 0 and "cnidra needs Kubernetes 1.34 or later" in old.stderr


def test_standard_labels_pull_secrets_pod_annotations_and_affinity() -> None:
    sets = ("imagePullSecrets[0].name=reg", "podAnnotations.team=net",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].key=net",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
            "admission.webhook.enabled=true")  # fmt: skip
    rendered = docs(*sets)
    for doc in rendered:
        if doc["kind"] in ("DaemonSet", "ClusterRole") and doc["metadata"]["name"] == "cnidra":
            labels = doc["metadata"]["labels"]
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["helm.sh/chart"] == f"cnidra-{chart_version()}"
    for doc in (d for d in rendered if d["kind"] in ("DaemonSet", "Deployment")):
        pod = doc["spec"]["template"]
        assert pod["metadata"]["annotations"]["team"] == "net"
        assert pod["spec"]["imagePullSecrets"] == [{"name": "reg"}]
        assert "nodeAffinity" in pod["spec"]["affinity"]


def test_the_webhook_certificate_is_kept_or_cert_managers() -> None:
    """The Secret carries its CA, so a later render against the cluster reuses it (lookup);
    with cert-manager, no certificate is made here at all."""
    made = docs("admission.webhook.enabled=true")
    [secret] = [d for d in made if d["kind"] == "Secret"]
    [hook] = [d for d in made if d["kind"] == "ValidatingWebhookConfiguration"]
    assert hook["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    managed = docs("admission.webhook.enabled=true", "admission.webhook.certManager.enabled=true")
    kinds = {d["kind"] for d in managed}
    assert {"Issuer", "Certificate"} <= kinds and "Secret" not in kinds
    [hook] = [d for d in managed if d["kind"] == "ValidatingWebhookConfiguration"]
    assert "caBundle" not in hook["webhooks"][0]["clientConfig"]
    assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].endswith(
        "/cnidra-webhook"
    )


def test_name_overrides_rename_every_object_and_the_identities_policies_name() -> None:
    rendered = docs("fullnameOverride=net-driver", "nameOverride=netdra",
                    "admission.webhook.enabled=true")  # fmt: skip
    text = yaml.safe_dump_all(rendered)
    assert "serviceaccount:cnidra-system:net-driver" in text  # the CEL policies' identity
    named = {(d["kind"], d["metadata"]["name"]) for d in rendered}
    assert {("DaemonSet", "net-driver"), ("ServiceAccount", "net-driver"),
            ("ClusterRole", "net-driver"), ("Deployment", "net-driver-webhook"),
            ("Secret", "net-driver-webhook-tls")} <= named  # fmt: skip
    [daemonset] = [d for d in rendered if d["kind"] == "DaemonSet"]
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == "net-driver"
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/name"] == "netdra"
    assert all(
        "cnidra" not in d["metadata"]["name"] or d["kind"] in ("DeviceClass",)
        for d in rendered
        if d["kind"] not in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    )


def test_metrics_stay_on_the_node_unless_asked_then_a_service_and_monitors() -> None:
    [ds] = [d for d in docs() if d["kind"] == "DaemonSet"]
    driver = ds["spec"]["template"]["spec"]["containers"][0]
    assert "--http-address=127.0.0.1:9177" in driver["args"]
    assert driver["livenessProbe"]["httpGet"]["host"] == "127.0.0.1"
    exposed = docs("metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true",
                   "metrics.serviceMonitor.labels.release=prom")  # fmt: skip
    [ds] = [d for d in exposed if d["kind"] == "DaemonSet"]
    driver = ds["spec"]["template"]["spec"]["containers"][0]
    assert "--http-address=$(CNIDRA_POD_IP):9177" in driver["args"]
    assert {"name": "CNIDRA_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in (
        driver["env"]
    )
    assert "host" not in driver["livenessProbe"]["httpGet"]  # kubelet probes the pod's address
    assert driver["ports"] == [{"name": "metrics", "containerPort": 9177, "protocol": "TCP"}]
    [svc] = [d for d in exposed if d["kind"] == "Service"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["ports"][0]["name"] == "metrics"
    assert set(svc["spec"]["selector"].items()) <= set(
        ds["spec"]["selector"]["matchLabels"].items()
    )
    [monitor] = [d for d in exposed if d["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert set(monitor["spec"]["selector"]["matchLabels"].items()) <= set(
        svc["metadata"]["labels"].items()
    )
    [pod_monitor] = [d for d in exposed if d["kind"] == "PodMonitor"]
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_the_dashboard_ships_as_a_configmap_for_grafanas_sidecar() -> None:
    import json

    [cm] = [
        d
        for d in docs("metrics.dashboard.enabled=true")
        if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(cm["data"]["cnidra.json"])
    assert board["uid"] == "cnidra" and len(board["panels"]) >= 8


def test_the_packaged_chart_renders_as_the_source_does(tmp_path: Path) -> None:
    out = subprocess.run(
        [ROOT / "hack" / "package-chart.sh", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    package = Path(out.stdout.strip())
    assert package.name == f"cnidra-{chart_version()}.tgz" and package.is_file()
    rendered = subprocess.run(
        [helm(), "template", "cnidra", str(package), "--namespace", "cnidra-system",
         "--set", "metrics.dashboard.enabled=true"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "kind: DaemonSet" in rendered and '"uid": "cnidra"' in rendered


def test_the_log_level_is_a_configmap_the_driver_follows() -> None:
    """driver.logLevel lives in a ConfigMap the driver reads (--log-level-file): a new level
    changes the ConfigMap, never the DaemonSet, so no driver pod restarts."""
    before, after = docs(), docs("driver.logLevel=debug")
    [cm] = [d for d in after if d["metadata"]["name"] == "cnidra-logging"]
    assert cm["kind"] == "ConfigMap" and cm["data"] == {"level": "debug"}
    [ds_before] = [d for d in before if d["kind"] == "DaemonSet"]
    [ds_after] = [d for d in after if d["kind"] == "DaemonSet"]
    assert ds_before == ds_after
    [driver] = ds_after["spec"]["template"]["spec"]["containers"]
    assert "--log-level-file=/etc/cnidra/logging/level" in driver["args"]
    assert not any(a.startswith("--log-level=") for a in driver["args"])


def test_a_nearly_exhausted_pool_alerts_at_90_percent_on_documented_series() -> None:
    import re

    assert not [d for d in docs() if d["kind"] == "PrometheusRule"]  # off unless asked
    [rule] = [
        d
        for d in docs("metrics.prometheusRule.enabled=true", "metrics.prometheusRule.labels.r=p")
        if d["kind"] == "PrometheusRule"
    ]
    assert rule["metadata"]["labels"]["r"] == "p"
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    nearly = alerts["CnidraIPPoolNearlyExhausted"]
    assert nearly["expr"] == "max by (pool) (cnidra_ipam_pool_used_ratio) >= 0.9"
    documented = set(re.findall(r"`(cnidra_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text()))
    used = {n for a in alerts.values() for n in re.findall(r"\bcnidra_[a-z_]+", a["expr"])}
    assert used <= documented
