"""A tenant (a ServiceAccount that may only create claims and pods in its namespace,
impersonated) against the real apiserver: every attack is refused at admission naming the field;
with admission removed the same pods fail prepare with an Event and the node's links, addresses,
routes and NAT rules stay byte for byte as they were; allowed configs still work; RBAC and the
node-scope policy are pinned. Attacks point only at the test bed's own links and 198.18.0.0/15
and are refused before any plugin runs."""

from __future__ import annotations

import base64
import difflib
import json
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cnidra.state.layout import DEFAULT_STATE_ROOT
from testbed import cluster as tb
from testbed.harness import ROOT, Cluster, DriverProcess, free_port
from tests.admission.test_webhook import self_signed
from tests.test_chart import docs as chart_docs
from tests.testbed.objects import claiming_pod, cni_config, env_image, pod, ready, template

pytestmark = pytest.mark.testbed
PRIMARY_BRIDGE = tb.BRIDGE  # the test bed's node bridge: what attacks aim at, never the real NIC
# what a tenant's network addresses with (cnidra's cluster IPAM; the attacks are refused
# before any pool is read, so it need not exist)
MACVLAN_IPAM = {"type": "cnidra", "pool": "tb-attacks"}
# host-local, for the attacks on its own fields (host-local written by a claim is refused
# anyway: cnidra.api.policy.SEGMENT_BLIND_IPAM; these still name the field)
HOST_LOCAL = {"type": "host-local", "ranges": [[{"subnet": "198.18.230.0/24"}]]}


def conf(*plugins: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"cniVersion": "1.1.0", "name": "attack", "plugins": list(plugins), **extra}


# (name, CNI config, extra CNIConfig fields, what the refusal names)
ATTACKS: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    (
        "uplink-into-pod",
        conf({"type": "host-device", "device": PRIMARY_BRIDGE}),
        {},
        "plugins[0].type: plugin 'host-device' is not allowed",
    ),
    (
        "replace-bridge-address",
        conf({"type": "bridge", "bridge": PRIMARY_BRIDGE, "forceAddress": True, "isGateway": True}),
        {},
        "plugins[0].forceAddress: never claim-settable",
    ),
    (
        "masquerade",
        conf({"type": "bridge", "ipMasq": True, "ipam": MACVLAN_IPAM}),
        {},
        "plugins[0].ipMasq: never claim-settable: adds NAT rules on the host",
    ),
    (
        "portmap-kubelet",
        conf(
            {"type": "macvlan", "ipam": MACVLAN_IPAM},
            {
                "type": "portmap",
                "runtimeConfig": {
                    "portMappings": [{"hostPort": 10250, "containerPort": 80, "protocol": "tcp"}]
                },
            },
        ),
        {},
        "plugins[1].runtimeConfig: never claim-settable",
    ),
    (
        "port-mappings-capability",
        conf({"type": "macvlan", "ipam": MACVLAN_IPAM}),
        {"capabilities": {"portMappings": [{"hostPort": 10250, "containerPort": 80}]}},
        "capabilities.portMappings: never claim-settable",
    ),
    (
        "other-link",
        conf({"type": "macvlan", "master": PRIMARY_BRIDGE, "ipam": MACVLAN_IPAM}),
        {},
        "names 'cnidra-tb0', but the scheduler allocated",
    ),
    (
        "host-local-datadir",
        conf({"type": "macvlan", "ipam": {**HOST_LOCAL, "dataDir": "/etc/kubernetes"}}),
        {},
        "ipam.dataDir: never claim-settable",
    ),
    (
        "tuning-datadir",
        conf({"type": "macvlan", "ipam": MACVLAN_IPAM}, {"type": "tuning", "dataDir": "/etc"}),
        {},
        "plugins[1].dataDir: never claim-settable",
    ),
    (
        "dhcp-socket",
        conf(
            {
                "type": "macvlan",
                "ipam": {"type": "dhcp", "daemonSocketPath": "/run/containerd/containerd.sock"},
            }
        ),
        {},
        "ipam.daemonSocketPath: never claim-settable",
    ),
    (
        "pretend-kube-system",
        conf({"type": "macvlan", "ipam": MACVLAN_IPAM}),
        {"args": {"K8S_POD_NAMESPACE": "kube-system", "K8S_POD_NAME": "kube-apiserver"}},
        "K8S_POD_NAMESPACE is a CNI_ARG the driver sets",
    ),
]


# Issue 22's classes: what the plugins read differently from a deny-list. Each aims at the
# node (a host file, NAT, a host IFB, kubelet's port) and must be refused in the form it runs.
STATIC = {"type": "static", "addresses": [{"address": "198.18.230.9/24"}]}
ATTACK_DIR = "/tmp/cnidra-attack-datadir"
ATTACKS += [
    (
        "string-ptp-masq",
        {},
        {"config": json.dumps(conf({"type": "ptp", "ipMasq": True, "ipam": MACVLAN_IPAM}))},
        "plugins[0].type: plugin 'ptp' is not allowed",
    ),
    (
        "string-portmap-kubelet",
        {},
        {
            "config": json.dumps(
                conf(
                    {"type": "macvlan", "ipam": MACVLAN_IPAM},
                    {
                        "type": "portmap",
                        "runtimeConfig": {
                            "portMappings": [{"hostPort": 10250, "containerPort": 80}]
                        },
                    },
                )
            )
        },
        "plugins[1].runtimeConfig: never claim-settable",
    ),
    (
        "string-bandwidth-ifb",
        {},
        {
            "config": json.dumps(
                conf(
                    {"type": "macvlan", "ipam": MACVLAN_IPAM},
                    {"type": "bandwidth", "ingressRate": 1000, "ingressBurst": 1000},
                )
            )
        },
        "plugins[1].type: plugin 'bandwidth' is not allowed",
    ),
    (
        "long-s-gateway",
        conf({"type": "bridge", "i\u017fGateway": True, "ipMa\u017fq": True, "ipam": STATIC}),
        {},
        "keys must be ASCII",
    ),
    (
        "second-ipam-type",
        conf({"type": "macvlan", "ipam": {**STATIC, "Type": "host-local", "dataDir": ATTACK_DIR}}),
        {},
        "is the same field as",  # which of type and Type is named: the apiserver sorts keys
    ),
    (
        "ipam-type-as-portmap",
        conf({"type": "macvlan", "ipam": {"TYPE": "portmap"}}),
        {},
        "ipam.TYPE: is spelled differently from the field 'type'",
    ),
    (
        "another-tenants-pool",
        conf({"type": "macvlan", "Name": "cnidra-ns.default.blue", "ipam": MACVLAN_IPAM}),
        {},
        "plugins[0].Name: is spelled differently from the field 'name'",
    ),
    (
        "resolvconf-into-status",
        conf({"type": "macvlan", "ipam": {**HOST_LOCAL, "resolvConf": "/etc/shadow"}}),
        {},
        "ipam.resolvConf: never claim-settable",
    ),
    (
        "passthru-locks-the-parent",
        conf({"type": "macvlan", "mode": "passthru", "ipam": MACVLAN_IPAM}),
        {},
        "claims.exclusiveLinkModes",
    ),
    (
        "deep-string",
        {},
        {"config": "[" * 2000 + "]" * 2000},
        "nested more than",
    ),
]

# Admission cannot know which link the scheduler will allocate; prepare refuses these.
PREPARE_ONLY = {"other-link"}


def attack_template(
    name: str, parent: str, config: dict[str, Any], extra: dict[str, Any]
) -> dict[str, Any]:
    doc = template(name, [("net", parent, config, "net1")])
    params = doc["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    params.update(extra)
    return doc


class Tenant:
    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.user = f"system:serviceaccount:{namespace}:tenant"

    def apply(self, *docs: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(
            "apply",
            "--as",
            self.user,
            "-n",
            self.namespace,
            "-f",
            "-",
            input_="\n---\n".join(json.dumps(d) for d in docs),
            check=False,
        )


def make_tenant(cluster: Cluster) -> Tenant:
    """A namespace (labelled for claim configs) whose ServiceAccount `tenant` may create
    claims, claim templates and pods there, and nothing else."""
    ns = f"tenant-{uuid.uuid4().hex[:6]}"
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"cni.networking.x-k8s.io/claim-config": "true"}},
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "tenant", "namespace": ns},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "tenant", "namespace": ns},
            "rules": [
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceclaims", "resourceclaimtemplates"],
                    "verbs": ["create", "get", "list", "patch", "delete"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["create", "get", "list", "patch", "delete"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns}],
        },
    )
    cluster.wait(
        "the namespace's default ServiceAccount",
        lambda: cluster.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
    )
    return Tenant(cluster, ns)


@pytest.fixture
def tenant(cluster: Cluster) -> Iterator[Tenant]:
    made = make_tenant(cluster)
    yield made
    cluster.kubectl("delete", "namespace", made.namespace, "--wait=false", check=False)


@pytest.fixture
def admission(cluster: Cluster, tmp_path: Path) -> Iterator[Callable[[], None]]:
    """The webhook as a process on the host, registered by URL with its CA, and the
    ValidatingAdmissionPolicies of deploy/; the fixture's value removes all of it."""
    cert, key = self_signed(tmp_path)
    port = free_port()
    log = open(tmp_path / "webhook.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cnidra",
            "webhook",
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--address",
            f"127.0.0.1:{port}",
            "--kubeconfig",
            cluster.env["KUBECONFIG"],
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    # the chart's own registration (rules, matchPolicy, namespaceSelector, matchConditions),
    # pointed at the process by URL
    webhook = chart_webhook()
    webhook["metadata"]["name"] = "test.cni.networking.x-k8s.io"
    webhook["webhooks"][0]["clientConfig"] = {
        "url": f"https://127.0.0.1:{port}/validate",
        "caBundle": base64.b64encode(cert.read_bytes()).decode(),
    }
    cluster.apply(webhook)
    apply_policies(cluster)

    def remove() -> None:
        cluster.kubectl(
            "delete",
            "validatingwebhookconfiguration",
            "test.cni.networking.x-k8s.io",
            "--ignore-not-found",
        )
        cluster.kubectl(
            "delete", "-f", str(ROOT / "deploy" / "admission.yaml"), "--ignore-not-found"
        )

    remove.port = port  # type: ignore[attr-defined]  # for tests that hold connections open
    try:
        yield remove
    finally:
        remove()
        proc.terminate()
        proc.wait(10)
        log.close()


def chart_webhook() -> dict[str, Any]:
    """The chart's ValidatingWebhookConfiguration, as `helm install` would register it."""
    return next(
        d
        for d in chart_docs("admission.webhook.enabled=true")
        if d["kind"] == "ValidatingWebhookConfiguration"
    )


def v1beta1(doc: dict[str, Any]) -> dict[str, Any]:
    """A v1 ResourceClaimTemplate in the v1beta1 shape (deviceClassName on the request)."""
    out = json.loads(json.dumps(doc))
    out["apiVersion"] = "resource.k8s.io/v1beta1"
    out["metadata"]["name"] = f"{out['metadata']['name']}-beta"
    for request in out["spec"]["spec"]["devices"]["requests"]:
        request.update(request.pop("exactly"))
    return out


def hold_connections(port: int, count: int) -> list[socket.socket]:
    """`count` connections to the webhook: half idle before TLS, half with a request begun."""
    held: list[socket.socket] = []
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 2:
            tls = context.wrap_socket(sock)
            tls.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 9999\r\n\r\n{")
            sock = tls
        held.append(sock)
    return held


def apply_policies(cluster: Cluster) -> None:
    """deploy/admission.yaml, and wait until the apiserver enforces it (policies and their
    bindings reach the admission plugin a moment after they are created)."""
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "admission.yaml"))
    probe = template("probe", [("net", "x", cni_config("probe", "x", "tb-probe"), "net1")])
    cluster.wait(
        "the admission policies to be enforced",
        lambda: (
            cluster.kubectl(
                "apply",
                "--dry-run=server",
                "-n",
                "default",
                "-f",
                "-",
                input_=json.dumps(probe),
                check=False,
            ).returncode
            != 0
        ),
        30,
    )


def node_state() -> dict[str, str]:
    """The node's networking as text, without counters, lifetimes and timestamps."""
    commands = {
        "links": ["ip", "-d", "link", "show"],
        "addresses": ["ip", "addr", "show"],
        "routes": ["ip", "route", "show", "table", "all"],
        "routes6": ["ip", "-6", "route", "show", "table", "all"],
        "iptables": ["iptables-save"],
        "ip6tables": ["ip6tables-save"],
        "nft": ["nft", "list", "ruleset"],
    }
    out = {}
    for name, cmd in commands.items():
        text = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False).stdout
        text = re.sub(r"(valid|preferred)_lft \S+| tentative| dadfailed", "", text)
        text = re.sub(r"\b\w+_timer\s+[\d.]+", "", text)  # a bridge's ticking timers
        text = re.sub(r"\[\d+:\d+\]|^#.*$|counter packets \d+ bytes \d+", "", text, flags=re.M)
        out[name] = text
    return out


def settled_node_state(timeout: float = 30) -> dict[str, str]:
    """node_state() once new links have settled: no IPv6 address of the node is still in
    duplicate address detection (whose end adds local routes)."""
    deadline = time.monotonic() + timeout
    while True:
        tentative = subprocess.run(
            ["ip", "-6", "-o", "addr", "show", "tentative"],
            capture_output=True, text=True, timeout=30, check=False,
        ).stdout.strip()  # fmt: skip
        if not tentative:
            return node_state()
        if time.monotonic() > deadline:
            raise AssertionError(f"addresses still tentative after {timeout} s: {tentative}")
        time.sleep(0.2)


def test_a_tenant_cannot_reach_the_node(
    cluster: Cluster,
    tenant: Tenant,
    admission: Callable[[], None],
    test_link: Callable[[str], str],
    tmp_path: Path,
    ip_pools: Callable[..., str],
) -> None:
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "deviceclass.yaml"))
    parent = test_link(f"tbs{uuid.uuid4().hex[:5]}")
    driver = DriverProcess(cluster, tmp_path)
    driver.start()
    try:
        cluster.wait("NRI", lambda: driver.health().get("nriConnected"), 30)
        cluster.wait("the slice", lambda: parent in driver_devices(cluster), 30)

        # 1. admission refuses each attack, naming the field, while idle and half-sent
        #    connections are held open to the webhook (one used to stop every review)
        held = hold_connections(admission.port, 50)  # type: ignore[attr-defined]
        for name, config, extra, expected in ATTACKS:
            out = tenant.apply(attack_template(name, parent, config, extra))
            if name in PREPARE_ONLY:
                assert out.returncode == 0, out.stderr
                continue
            assert out.returncode != 0, f"{name} was admitted"
            assert expected in out.stderr, (name, out.stderr)
        # the namespace policies (CEL): an admin class not granted to the namespace
        granted = attack_template(
            "admin-class", parent, conf({"type": "macvlan", "ipam": MACVLAN_IPAM}), {}
        )
        granted["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = (
            "macvlan-data.cni.networking.x-k8s.io"
        )
        out = tenant.apply(granted)
        assert out.returncode != 0 and "may not use DeviceClass(es) macvlan-data" in out.stderr
        # the same in the v1beta1 shape (deviceClassName on the request itself): every served
        # version is judged converted to v1
        beta = v1beta1(granted)
        out = tenant.apply(beta)
        assert out.returncode != 0 and "may not use DeviceClass(es) macvlan-data" in out.stderr
        hostile = v1beta1(attack_template("beta-masq", parent, ATTACKS[2][1], {}))
        out = tenant.apply(hostile)
        assert out.returncode != 0 and "ipMasq: never claim-settable" in out.stderr
        for sock in held:
            sock.close()
        # allowed configs still work end to end, as the tenant
        pool = ip_pools("198.19.140.0/24", tenant.namespace)
        good = template("good", [("net", parent, cni_config("good", parent, pool), "net1")])
        assert tenant.apply(good, claiming_pod("good", "good")).returncode == 0
        ready(cluster, tenant.namespace, "good")

        # 2. without admission the same claims fail prepare, and the node is untouched
        admission()
        before = settled_node_state()  # the good pod's links settled
        names = [name for name, *_ in ATTACKS]
        for name, config, extra, _ in ATTACKS:
            out = tenant.apply(
                attack_template(name, parent, config, extra), claiming_pod(name, name)
            )
            assert out.returncode == 0, out.stderr
        for name, _, _, expected in ATTACKS:
            messages = cluster.wait(
                f"{name} to fail prepare",
                lambda n=name: [
                    e["message"]
                    for e in cluster.events(n, tenant.namespace)
                    if e["reason"] == "FailedPrepareDynamicResources"
                ],
                90,
            )
            assert any(expected in m for m in messages), (name, messages)
        after = node_state()
        assert not Path(ATTACK_DIR).exists(), "a plugin wrote where a tenant said"
        for part, text in before.items():
            diff = "\n".join(difflib.unified_diff(text.splitlines(), after[part].splitlines()))
            assert text == after[part], f"{part} changed:\n{diff}"
        records = driver.health()["sandboxes"]
        assert records == 1  # the good pod only
        for name in names:
            cluster.kubectl("delete", "pod", name, "-n", tenant.namespace, "--wait=false")
    finally:
        driver.stop()


def driver_devices(cluster: Cluster) -> set[str]:
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    return {
        d["name"]
        for s in slices
        if s["spec"]["driver"] == "cni.dra.networking.x-k8s.io"
        for d in s["spec"]["devices"]
    }


def test_the_drivers_rbac_holds_exactly_what_its_code_calls(cluster: Cluster) -> None:
    # the CRDs' resources are known to `auth can-i` only once served (alone, this test ran
    # before any other installed them, and every CRD row said no)
    cluster.install_cnidra_api()
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
    sa = "system:serviceaccount:cnidra-system:cnidra"

    def can(*args: str) -> bool:
        out = cluster.kubectl("auth", "can-i", "--as", sa, *args, check=False)
        return out.stdout.strip() == "yes"

    allowed = [
        ("get", "resourceclaims.resource.k8s.io", "-n", "any"),
        # IPAM: are a deleted IPAMClaim's addresses still in a claim's status on any node
        ("list", "resourceclaims.resource.k8s.io", "-n", "any"),
        ("patch", "resourceclaims.resource.k8s.io", "-n", "any"),
        ("patch", "resourceclaims.resource.k8s.io", "--subresource=status", "-n", "any"),
        ("list", "resourceslices.resource.k8s.io"),
        ("create", "resourceslices.resource.k8s.io"),
        ("patch", "resourceslices.resource.k8s.io"),
        ("delete", "resourceslices.resource.k8s.io"),
        ("get", "nodes"),
        ("get", "namespaces"),
        ("create", "events", "-n", "any"),
        # reading claims ahead (a node's pods, by field selector) and network policy (peers'
        # labels, namespaces' labels, the policies), both on by default
        ("list", "pods", "-A"),
        ("watch", "pods", "-A"),
        ("list", "namespaces"),
        ("watch", "namespaces"),
        ("list", "multi-networkpolicies.k8s.cni.cncf.io", "-A"),
        ("watch", "cniadminnetworkpolicies.cni.networking.x-k8s.io"),
        # a policy's entry of this node in its status (an interface it cannot enforce)
        ("patch", "multi-networkpolicies.k8s.cni.cncf.io", "--subresource=status", "-n", "any"),
        ("patch", "cniadminnetworkpolicies.cni.networking.x-k8s.io", "--subresource=status"),
        # pool accounting: pools' counts, and the scheduler's FailedScheduling Events
        ("patch", "cniippools.cni.networking.x-k8s.io", "--subresource=status"),
        ("watch", "events", "-A"),
    ]
    refused = [
        ("watch", "resourceclaims.resource.k8s.io", "-A"),
        ("delete", "resourceclaims.resource.k8s.io", "-n", "any"),
        ("update", "resourceclaims.resource.k8s.io", "--subresource=status", "-n", "any"),
        ("create", "pods", "-n", "any"),
        ("get", "secrets", "-n", "any"),
        ("patch", "nodes"),
        ("patch", "namespaces"),
        ("create", "multi-networkpolicies.k8s.cni.cncf.io", "-n", "any"),
        ("patch", "multi-networkpolicies.k8s.cni.cncf.io", "-n", "any"),
        ("patch", "pods", "--subresource=status", "-n", "any"),
        ("patch", "events", "-n", "any"),
        ("create", "deviceclasses.resource.k8s.io"),
    ]
    assert [a for a in allowed if not can(*a)] == []
    assert [r for r in refused if can(*r)] == []


def allocated_claim(cluster: Cluster, namespace: str, name: str, node: str) -> None:
    """A claim as the scheduler leaves it: allocated to `node` (written by the admin)."""
    cluster.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "net", "exactly": {"deviceClassName": "cni.networking.x-k8s.io"}}
                    ]
                }
            },
        }
    )
    allocation = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "net",
                            "driver": "cni.dra.networking.x-k8s.io",
                            "pool": node,
                            "device": "tbdata0",
                        }
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            }
        }
    }
    cluster.kubectl(
        "patch", "resourceclaim", name, "-n", namespace, "--subresource=status",
        "--type=merge", "-p", json.dumps(allocation),
    )  # fmt: skip


def node_driver(cluster: Cluster, node: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """kubectl as the driver of `node`: its service account's token bound to the Node, as the
    chart's DaemonSet gets it."""
    token = cluster.kubectl(
        "create", "token", "cnidra", "-n", "cnidra-system",
        "--bound-object-kind", "Node", "--bound-object-name", node,
    ).stdout.strip()  # fmt: skip
    server = cluster.kubectl(
        "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"
    ).stdout

    def as_driver(*args: str, input_: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(cluster.bins.k8s / "kubectl"), "--kubeconfig=/dev/null", "--server", server,
             "--insecure-skip-tls-verify", "--token", token, *args],
            input=input_, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    return as_driver


def refused(out: subprocess.CompletedProcess[str], *whys: str) -> None:
    """Refused, for one of `whys`."""
    assert out.returncode != 0, f"admitted: {out.stdout}"
    assert any(why in out.stderr for why in whys), out.stderr


def test_a_nodes_token_touches_only_its_own_node(
    cluster: Cluster, namespace: str, second_node: tb.Node
) -> None:
    """Two node-bound tokens, as a stolen one would be used: each writes its own node's slices,
    claims (and their status), pods' network-status, blocks and IPAMClaims, never the other's."""
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
    apply_policies(cluster)
    a_node, b_node = tb.NODE, second_node.name
    try:
        as_a, as_b = node_driver(cluster, a_node), node_driver(cluster, b_node)

        def slice_for(driver: Callable[..., Any], node: str) -> subprocess.CompletedProcess[str]:
            doc = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"scope-test-{node}"},
                "spec": {
                    "driver": "cni.dra.networking.x-k8s.io",
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [],
                },
            }
            out: subprocess.CompletedProcess[str] = driver(
                "apply", "--server-side", "--field-manager", "cnidra", "-f", "-",
                input_=yaml.safe_dump(doc),
            )  # fmt: skip
            return out

        own = slice_for(as_a, a_node)
        assert own.returncode == 0, own.stderr
        other = cluster.wait(
            "the node-scope policy to refuse",
            lambda: (out := slice_for(as_a, b_node)).returncode != 0 and out,
            20,
        )
        refused(other, "may write only that node's ResourceSlices")
        refused(slice_for(as_b, a_node), "may write only that node's ResourceSlices")

        allocated_claim(cluster, namespace, "mine", a_node)
        allocated_claim(cluster, namespace, "theirs", b_node)

        def finalize(driver: Callable[..., Any], claim: str) -> subprocess.CompletedProcess[str]:
            patch = {"metadata": {"finalizers": ["cni.dra.networking.x-k8s.io/interfaces"]}}
            out: subprocess.CompletedProcess[str] = driver(
                "patch", "resourceclaim", claim, "-n", namespace, "--type=merge",
                "-p", json.dumps(patch),
            )  # fmt: skip
            return out

        def claim_status(
            driver: Callable[..., Any], claim: str
        ) -> subprocess.CompletedProcess[str]:
            device = {
                "driver": "cni.dra.networking.x-k8s.io", "pool": a_node, "device": "tbdata0",
                "networkData": {"interfaceName": "net1", "ips": ["198.18.9.9/24"]},
            }  # fmt: skip
            doc = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "status": {"devices": [device]},
            }
            out: subprocess.CompletedProcess[str] = driver(  # as the driver writes it: applied
                "apply", "--server-side", "--field-manager", "cnidra", "--subresource=status",
                "-f", "-", input_=json.dumps(doc),
            )  # fmt: skip
            return out

        mine = finalize(as_a, "mine")
        assert mine.returncode == 0, mine.stderr
        refused(finalize(as_a, "theirs"), "may write only claims allocated to that node")
        # 1.36 refuses first (DRAResourceClaimGranularStatusAuthorization: not its node's);
        # on 1.34/1.35 the node-scope policy matches resourceclaims/status and refuses
        refused(
            claim_status(as_b, "mine"),
            "may write only claims allocated to that node",
            'cannot arbitrary-node:patch resource "resourceclaims/driver"',
        )
        status = claim_status(as_a, "mine")
        assert status.returncode == 0, status.stderr
        # as on 1.34/1.35, where the granular status authorization does not exist: RBAC lets
        # every node's token patch resourceclaims/status, and the policy alone scopes it
        tb.stop("kube-apiserver")
        tb.start_apiserver(cluster.bins, {"DRAResourceClaimGranularStatusAuthorization": False})
        try:
            cluster.wait(
                "the policies to be loaded again",
                lambda: "may write only that node's" in slice_for(as_a, b_node).stderr,
                30,
            )
            refused(claim_status(as_b, "mine"), "may write only claims allocated to that node")
            again = claim_status(as_a, "mine")
            assert again.returncode == 0, again.stderr
        finally:
            tb.stop("kube-apiserver")
            tb.start_apiserver(cluster.bins)

        pod_writes_are_node_scoped(cluster, namespace, as_a, as_b, a_node, b_node)
        ipam_writes_are_node_scoped(cluster, namespace, as_a, as_b, a_node, b_node)
    finally:
        for node in (a_node, b_node):
            cluster.kubectl("delete", "resourceslice", f"scope-test-{node}", "--ignore-not-found")
        cluster.kubectl(
            "delete", "cniipblocks", "-l", "cni.networking.x-k8s.io/pool=scope-test", check=False
        )  # fmt: skip
        for name in ("here", "there"):
            cluster.kubectl(
                "delete", "pod", name, "-n", namespace, "--wait=false", "--ignore-not-found"
            )  # fmt: skip
        for claim in ("mine", "theirs"):
            cluster.kubectl(
                "patch", "resourceclaim", claim, "-n", namespace, "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False,
            )  # fmt: skip
        cluster.kubectl(
            "patch", "ipamclaim", "vm.scope", "-n", namespace, "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip
        cluster.kubectl(
            "delete", "-f", str(ROOT / "deploy" / "admission.yaml"), "--ignore-not-found"
        )


def pod_writes_are_node_scoped(
    cluster: Cluster,
    namespace: str,
    as_a: Callable[..., subprocess.CompletedProcess[str]],
    as_b: Callable[..., subprocess.CompletedProcess[str]],
    a_node: str,
    b_node: str,
) -> None:
    """Pods: the network-status annotation of pods on its own node, nothing else."""
    for name, node in (("here", a_node), ("there", b_node)):
        cluster.apply_in(namespace, pod(name, env_image(), nodeName=node))

    def annotate(
        driver: Callable[..., Any], name: str, **annotations: str
    ) -> subprocess.CompletedProcess[str]:
        patch = {"metadata": {"annotations": annotations}}
        out: subprocess.CompletedProcess[str] = driver(
            "patch", "pod", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch)
        )
        return out

    net = {"k8s.v1.cni.cncf.io/network-status": json.dumps([{"name": "ns/green"}])}
    here = annotate(as_a, "here", **net)
    assert here.returncode == 0, here.stderr
    refused(annotate(as_a, "there", **net), "may write only pods on that node")
    refused(annotate(as_b, "here", **net), "may write only pods on that node")
    refused(annotate(as_a, "here", **{"example.com/owner": "x"}), "may change only the annotation")
    refused(
        as_a("label", "pod", "here", "-n", namespace, "app=x"), "may change only the annotation"
    )


def ipam_writes_are_node_scoped(
    cluster: Cluster,
    namespace: str,
    as_a: Callable[..., subprocess.CompletedProcess[str]],
    as_b: Callable[..., subprocess.CompletedProcess[str]],
    a_node: str,
    b_node: str,
) -> None:
    """cnidra IPAM's objects: blocks only of its own node, owned by its Node, never another's
    (the old spec.node is compared); of an IPAMClaim its finalizer (dropped only once it is
    being deleted), its node label (only of one nobody holds with addresses) and the status
    of those it holds, never rewriting the addresses."""
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds.yaml"))
    cluster.wait(
        "the IPAM CRDs",
        lambda: cluster.kubectl("get", "cniipblocks,ipamclaims", "-A", check=False).returncode == 0,
        60,
    )
    uids = {n: cluster.get("node", n)["metadata"]["uid"] for n in (a_node, b_node)}

    def block(
        driver: Callable[..., subprocess.CompletedProcess[str]],
        index: int,
        node: str,
        owner: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        owner = owner if owner is not None else node
        meta: dict[str, Any] = {
            "name": f"scope-test.0.{index}",
            "labels": {
                "cni.networking.x-k8s.io/pool": "scope-test",
                "cni.networking.x-k8s.io/node": node,
            },
        }
        if owner:
            meta["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": owner, "uid": uids[owner]}
            ]
        doc = {
            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
            "kind": "CNIIPBlock",
            "metadata": meta,
            "spec": {
                "pool": "scope-test",
                "range": 0,
                "cidr": f"198.18.9.{index * 16}/28",
                "node": node,
            },
        }
        return driver("create", "-f", "-", input_=json.dumps(doc))

    why = "may reserve, change and release only blocks of that node"
    mine = block(as_a, 0, a_node)
    assert mine.returncode == 0, mine.stderr
    refused(block(as_a, 1, b_node), why)
    refused(block(as_a, 1, a_node, owner=""), why)  # not owned by its Node: never collected
    refused(block(as_a, 1, a_node, owner=b_node), why)
    theirs = block(as_b, 2, b_node)
    assert theirs.returncode == 0, theirs.stderr
    a_owner = {"apiVersion": "v1", "kind": "Node", "name": a_node, "uid": uids[a_node]}
    take = {
        "metadata": {
            "labels": {"cni.networking.x-k8s.io/node": a_node},
            "ownerReferences": [a_owner],
        },
        "spec": {"node": a_node},
    }
    refused(
        as_a("patch", "cniipblock", "scope-test.0.2", "--type=merge", "-p", json.dumps(take)), why
    )
    refused(as_a("delete", "cniipblock", "scope-test.0.2"), why)
    refused(as_b("delete", "cniipblock", "scope-test.0.0"), why)
    steal = as_a(
        "patch", "cniipblock", "scope-test.0.0", "--type=merge",
        "-p", json.dumps({"spec": {"cidr": "198.18.9.64/28"}}),
    )  # fmt: skip
    refused(steal, why)

    cluster.apply_in(
        namespace,
        {
            "apiVersion": "k8s.cni.cncf.io/v1alpha1",
            "kind": "IPAMClaim",
            "metadata": {"name": "vm.scope"},
            "spec": {"network": "data", "interface": "net1"},
        },
    )

    def patch_claim(
        driver: Callable[..., subprocess.CompletedProcess[str]], patch: dict[str, Any], *extra: str
    ) -> subprocess.CompletedProcess[str]:
        return driver(
            "patch", "ipamclaim", "vm.scope", "-n", namespace, "--type=merge",
            "-p", json.dumps(patch), *extra,
        )  # fmt: skip

    holder = "ipam.cni.networking.x-k8s.io/node"
    finalizer = "cni.dra.networking.x-k8s.io/ipam"
    ips = {"status": {"ips": ["198.18.9.5/28"]}}
    refused(patch_claim(as_a, ips, "--subresource=status"), "IPAMClaims it holds")
    hold = patch_claim(as_a, {"metadata": {"labels": {holder: a_node}, "finalizers": [finalizer]}})
    assert hold.returncode == 0, hold.stderr
    status = patch_claim(as_a, ips, "--subresource=status")
    assert status.returncode == 0, status.stderr
    # node B: neither the label, nor the status, nor the finalizer of A's IPAMClaim
    refused(patch_claim(as_b, {"metadata": {"labels": {holder: b_node}}}), "may mark itself")
    refused(
        patch_claim(as_b, {"status": {"ips": ["198.18.9.6/28"]}}, "--subresource=status"),
        "IPAMClaims it holds",
    )
    refused(patch_claim(as_b, {"metadata": {"finalizers": None}}), "only its node label")
    # node A: not the addresses it wrote, nor anything but its label and finalizer
    refused(
        patch_claim(as_a, {"status": {"ips": ["198.18.9.6/28"]}}, "--subresource=status"),
        "never rewrites",
    )
    refused(patch_claim(as_a, {"spec": {"interface": "net9"}}), "only its node label")
    refused(patch_claim(as_a, {"metadata": {"finalizers": None}}), "only its node label")
    cluster.kubectl("delete", "ipamclaim", "vm.scope", "-n", namespace, "--wait=false")
    release = patch_claim(as_a, {"metadata": {"finalizers": None}})  # being deleted: allowed
    assert release.returncode == 0, release.stderr


def test_a_namespace_without_the_label_may_not_carry_configs(
    cluster: Cluster, namespace: str, test_link: Callable[[str], str]
) -> None:
    apply_policies(cluster)
    try:
        parent = test_link(f"tbn{uuid.uuid4().hex[:5]}")
        doc = template("plain", [("net", parent, cni_config("plain", parent, "tb-plain"), "net1")])
        out = cluster.kubectl(
            "apply", "-n", namespace, "-f", "-", input_=json.dumps(doc), check=False
        )
        assert out.returncode != 0
        assert "cni.networking.x-k8s.io/claim-config=true" in out.stderr, out.stderr
        assert (
            cluster.kubectl(
                "apply",
                "-n",
                namespace,
                "-f",
                "-",
                input_=json.dumps(pod("x", env_image())),
                check=False,
            ).returncode
            == 0
        )
    finally:
        cluster.kubectl(
            "delete", "-f", str(ROOT / "deploy" / "admission.yaml"), "--ignore-not-found"
        )


def test_a_primary_network_bridge_is_never_published(
    cluster: Cluster, test_link: Callable[[str], str], tmp_path: Path
) -> None:
    """A kubenet-like bridge (the pods' gateway address, a pod's veth as a port) is the primary
    network's: a tenant plugged into it would sit beside every pod with the address it asked
    for. It is never a device; a bridge cnidra's own networks use (no address) still is."""
    tag = uuid.uuid4().hex[:5]
    bridge, ns, veth = f"tbk{tag}", f"tbk{tag}", f"tbkv{tag}"
    control = test_link(f"tbc{tag}")

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    driver = DriverProcess(cluster, tmp_path, defaults=True)  # state where deploy/ keeps it
    try:
        ip("link", "add", bridge, "type", "bridge")
        ip("addr", "add", "198.18.242.1/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        ip("netns", "add", ns)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", veth, "master", bridge, "up")
        driver.start()
        cluster.wait("the slice", lambda: control in driver_devices(cluster), 30)
        assert bridge not in driver_devices(cluster)
        assert veth not in driver_devices(cluster)
    finally:
        driver.stop()
        shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)  # it prepared nothing; as it was
        for args in (["link", "del", veth], ["link", "del", bridge], ["netns", "del", ns]):
            subprocess.run(["ip", *args], check=False, capture_output=True, timeout=30)


def webhook_at(tmp_path: Path, name: str, policy: str, port: int) -> dict[str, Any]:
    """The chart's webhook registration, named `name`, calling https://127.0.0.1:`port` (a
    self-signed certificate of tmp_path's) with `policy` and a 3 s timeout."""
    cert, _ = self_signed(tmp_path)
    webhook = chart_webhook()
    webhook["metadata"]["name"] = f"{name}.cni.networking.x-k8s.io"
    hook = webhook["webhooks"][0]
    hook["failurePolicy"] = policy
    hook["timeoutSeconds"] = 3
    hook["clientConfig"] = {
        "url": f"https://127.0.0.1:{port}/validate",
        "caBundle": base64.b64encode(cert.read_bytes()).decode(),
    }
    return webhook


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
@pytest.mark.parametrize("fault", ["down", "slow"])
def test_a_webhook_that_is_down_or_slow_blocks_only_what_it_judges(
    cluster: Cluster, tenant: Tenant, tmp_path: Path, policy: str, fault: str
) -> None:
    """The chart's registration with nothing listening (down) or a listener that never answers
    (slow, cut off at the registration's timeoutSeconds): with failurePolicy Fail a claim
    carrying a cnidra config is refused ("failed calling webhook"), with Ignore it is admitted
    (and prepare judges it: test_a_tenant_cannot_reach_the_node, part 2). Either way a claim
    without one is admitted and an update of a claim (its finalizers, labels: the spec is
    immutable) is never blocked."""
    port = free_port()
    webhook = webhook_at(tmp_path, f"{fault}-{policy.lower()}", policy, port)
    silent = None
    if fault == "slow":  # accepts, then says nothing (no TLS handshake, no answer)
        silent = socket.socket()
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        silent.bind(("127.0.0.1", port))
        silent.listen(128)
    plain = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "plain", "namespace": tenant.namespace},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "net", "exactly": {"deviceClassName": "cni.networking.x-k8s.io"}}
                ]
            }
        },
    }
    ours = template("ours", [("net", "x", cni_config("ours", "x", "tb-ours"), "net1")])
    hostile = attack_template("masq", "x", ATTACKS[2][1], {})
    cluster.apply(webhook)
    try:
        if policy == "Fail":
            cluster.wait(
                "the webhook registration to be enforced",
                lambda: tenant.apply(ours).returncode != 0,
                30,
            )
            started = time.monotonic()
            assert "failed calling webhook" in tenant.apply(ours).stderr
            assert time.monotonic() - started < 3 + 10  # the registration's timeout bounds it
        else:
            time.sleep(3)  # the registration is in force
            started = time.monotonic()
            out = tenant.apply(hostile)
            assert out.returncode == 0, out.stderr  # admitted: prepare is what judges it now
            assert time.monotonic() - started < 3 + 10
        assert tenant.apply(plain).returncode == 0
        patched = cluster.kubectl(
            "label", "resourceclaim", "plain", "-n", tenant.namespace, "x=y", check=False
        )
        assert patched.returncode == 0, patched.stderr
    finally:
        cluster.kubectl(
            "delete", "validatingwebhookconfiguration", webhook["metadata"]["name"],
            "--ignore-not-found",
        )  # fmt: skip
        if silent is not None:
            silent.close()


def test_admission_never_blocks_a_finalizer_update_or_deletion_of_an_admitted_claim(
    cluster: Cluster, tenant: Tenant, tmp_path: Path
) -> None:
    """A claim carrying a cnidra config, admitted earlier, whose world then changed: the
    webhook is down under failurePolicy Fail, the chart's CEL policies are in force, and its
    namespace lost the claim-config label (so a create of the same claim is refused). Adding
    and removing a finalizer (what the driver does), a status-only write and its deletion still
    go through: only CREATEs are judged."""
    name = f"kept-{uuid.uuid4().hex[:5]}"
    tpl = template("kept", [("net", "x", cni_config("kept", "x", "tb-kept"), "net1")])
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": tenant.namespace},
        "spec": tpl["spec"]["spec"],
    }
    out = tenant.apply(claim)
    assert out.returncode == 0, out.stderr
    webhook = webhook_at(tmp_path, "kept-fail", "Fail", free_port())  # nothing listens there
    apply_policies(cluster)
    cluster.apply(webhook)
    cluster.kubectl("label", "namespace", tenant.namespace, "cni.networking.x-k8s.io/claim-config-")
    try:
        again = dict(claim, metadata={"name": f"{name}-2", "namespace": tenant.namespace})
        cluster.wait(  # the world changed: a create of such a claim is refused now
            "a create to be refused", lambda: tenant.apply(again).returncode != 0, 30
        )

        def patch(body: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
            return cluster.kubectl(
                "patch", "resourceclaim", name, "-n", tenant.namespace, "--type=merge",
                "-p", json.dumps(body), *extra, check=False,
            )  # fmt: skip

        for body, extra in (
            ({"metadata": {"finalizers": ["cni.dra.networking.x-k8s.io/test"]}}, ()),
            ({"status": {"devices": []}}, ("--subresource=status",)),
            ({"metadata": {"finalizers": None}}, ()),
        ):
            out = patch(body, *extra)
            assert out.returncode == 0, (body, out.stderr)
        gone = cluster.kubectl(
            "delete", "resourceclaim", name, "-n", tenant.namespace, "--timeout=30s",
            check=False,
        )  # fmt: skip
        assert gone.returncode == 0, gone.stderr
    finally:
        cluster.kubectl(
            "delete", "validatingwebhookconfiguration", webhook["metadata"]["name"],
            "--ignore-not-found",
        )  # fmt: skip
        cluster.kubectl(
            "delete", "-f", str(ROOT / "deploy" / "admission.yaml"), "--ignore-not-found"
        )
        cluster.kubectl(
            "delete", "resourceclaim", name, "-n", tenant.namespace, "--ignore-not-found",
            "--wait=false",
        )  # fmt: skip
