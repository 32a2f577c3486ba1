"""Issue 43 on the test bed: three pods on a macvlan network of node 1 (a claim-defined network,
`claim:<namespace>/net`), the driver as deploy/ runs it (network policy on): a serves TCP 8080
(its container port named `http`; busybox nc answers "ok"), b and d are clients labelled
app=web. Real TCP through `kubectl exec` from b and d to a, after each row of `ROWS` (the
policies in force, tenant and admin, and what each client must get), both clients probed at
once; then the driver stopped (the tables stay: policy holds while it is down) and started
again (read back, still holding, and following the next change), and b relabelled. Each
probe's expected result is asserted, waited for no longer than the enforcement takes plus the
exec's own time, and then asserted once more (not a probe that passed during a change).

The claim of a's interface carries `NetworkPolicyEnforced` True, `InPodNamespace` (macvlan:
the pod's namespace; no container of a has CAP_NET_ADMIN).

A ptp network (`test_ptp_...`): its table is on the host's end of the pod's veth (the
machine's namespace is node 1's: a cnidra-owned table named after the network and that veth,
nothing else of the machine touched), so a pod that flushes its own namespace's nftables
(done from the host here, as a pod with CAP_NET_ADMIN could) is still held; the claim says
`OnHostSide`; the table goes with the pod.

A network no policy can be enforced on (`test_a_policy_...`: the tests' pass-through plugin,
which gives the pod no kernel interface): the claim says `NotEnforceable`, the policy that
selects the pod gets a Warning Event and node 1's entry in `status.nodes` (a real apiserver:
the status subresource, the driver's RBAC, server-side apply per node), shown by `kubectl get`,
and the entry goes with the pod.

Not here: UDP (the test image's busybox nc has none), namespace selectors (a claim network is
one namespace's), peers on node 2, a bridge, an edit under traffic, an address change, the
tenancy rule: tests/testbed/test_netpolicy_traffic.py, probing from inside the pods' namespaces.

Only the test's own link (a host-only bridge) and 198.19.43.0/24 (inside 198.18.0.0/15)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from cnidra.api.constants import (
    CONDITION_POLICY,
    REASON_POLICY_HOST_SIDE,
    REASON_POLICY_POD_NAMESPACE,
)
from cnidra.api.netpolicy_node import HOST_TABLE_PREFIX
from testbed.harness import Cluster, DriverProcess
from testbed.incluster import FAULT_PLUGINS
from testbed.layout import NODE
from tests.testbed.conftest import Attached, slice_devices
from tests.testbed.objects import (
    TEST_CLASS,
    admin_class,
    apply,
    claiming_pod,
    claims_of,
    device_template,
    plugins_class,
    pod_addresses,
    ready,
    select_link,
)
from tests.testbed.test_bandwidth import sandbox_netns

pytestmark = pytest.mark.testbed

SUBNET = "198.19.43.0/24"
PORT = 8080
CLIENTS = ("b", "d")
# the policy reaches the pods' tables within a second; each probe is a kubectl exec
WITHIN = 30.0


@dataclass(frozen=True)
class Row:
    """Policies in force (the tenant's `db` spec, the admin's ingress rules for a) and what
    each client gets: a TCP connection to a's port 8080 and its answer, or not."""

    what: str
    tenant: dict[str, Any] | None
    admin: list[dict[str, Any]] | None
    expected: dict[str, bool]


DB = {"matchLabels": {"app": "db"}}
WEB = {"podSelector": {"matchLabels": {"app": "web"}}}


def rows(b: str) -> list[Row]:
    """The table (b: b's address on the network). What it documents is docs/network-policy.md's
    semantics, each row as the cluster enforces it."""
    return [
        Row("no policy", None, None, {"b": True, "d": True}),
        Row(
            "a selected, no rule: default deny", {"podSelector": DB}, None, {"b": False, "d": False}
        ),
        Row(
            "from app=web to the named port http (a's 8080)",
            {"podSelector": DB, "ingress": [{"from": [WEB], "ports": [{"port": "http"}]}]},
            None,
            {"b": True, "d": True},
        ),
        Row(
            "from app=web to 9090 only",
            {"podSelector": DB, "ingress": [{"from": [WEB], "ports": [{"port": 9090}]}]},
            None,
            {"b": False, "d": False},
        ),
        Row(
            "from the subnet except b's address (ipBlock except)",
            {
                "podSelector": DB,
                "ingress": [{"from": [{"ipBlock": {"cidr": SUBNET, "except": [f"{b}/32"]}}]}],
            },
            None,
            {"b": False, "d": True},
        ),
        Row(
            "the tenant allows everyone; the admin denies b's address: the tenant cannot widen it",
            {"podSelector": DB, "ingress": [{}]},
            [{"name": "no-b", "action": "Deny", "from": [{"networks": [f"{b}/32"]}]}],
            {"b": False, "d": True},
        ),
    ]


def tenant_policy(namespace: str, spec: dict[str, Any], network: str = "net") -> dict[str, Any]:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1beta1",
        "kind": "MultiNetworkPolicy",
        "metadata": {
            "name": "db",
            "namespace": namespace,
            "annotations": {"k8s.v1.cni.cncf.io/policy-for": f"claim:{namespace}/{network}"},
        },
        "spec": spec,
    }


def admin_policy(namespace: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIAdminNetworkPolicy",
        "metadata": {"name": admin_name(namespace)},
        "spec": {
            "priority": 10,
            "subject": {
                "pods": {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "podSelector": DB,
                }
            },
            "networks": [f"claim:{namespace}/net"],
            "ingress": ingress,
        },
    }


def admin_name(namespace: str) -> str:
    return f"test-{namespace}"


LAST: dict[str, str] = {}  # each client's last probe, for a failure's message


def reaches(cluster: Cluster, namespace: str, client: str, address: str) -> bool:
    """A TCP connection from `client` to a's server, and its answer (busybox's nc)."""
    out = cluster.kubectl(
        "exec", "-n", namespace, client, "--", "nc", "-w", "2", address, str(PORT),
        check=False, input_="",
    )  # fmt: skip
    LAST[client] = f"rc {out.returncode}: {out.stdout.strip()} {out.stderr.strip()}"
    return out.returncode == 0 and "ok" in out.stdout


def probes(cluster: Cluster, namespace: str, address: str) -> dict[str, bool]:
    with ThreadPoolExecutor(len(CLIENTS)) as pool:
        got = pool.map(lambda c: reaches(cluster, namespace, c, address), CLIENTS)
        return dict(zip(CLIENTS, got, strict=True))


def settles(made: Attached, address: str, expected: dict[str, bool], what: str) -> None:
    cluster, namespace = made.driver.cluster, made.namespace
    try:
        cluster.wait(what, lambda: probes(cluster, namespace, address) == expected, WITHIN)
    except AssertionError as exc:
        log = [
            line
            for line in made.driver.log.read_text().splitlines()
            if "policy" in line.lower() or "Traceback" in line
        ]
        raise AssertionError(
            f"{exc}; expected {expected}; the last probes: {LAST}; synced "
            f"{made.driver.health().get('networkPolicySynced')}; the driver's log: {log[-20:]}"
        ) from None
    assert probes(cluster, namespace, address) == expected, (what, LAST)


def in_force(cluster: Cluster, namespace: str, row: Row) -> None:
    if row.tenant is None:
        cluster.kubectl(
            "delete", "multi-networkpolicies", "-n", namespace, "db", "--ignore-not-found"
        )
    else:
        apply(cluster, namespace, tenant_policy(namespace, row.tenant))
    if row.admin is None:
        cluster.kubectl(
            "delete", "cniadminnetworkpolicies", admin_name(namespace), "--ignore-not-found"
        )
    else:
        apply(cluster, namespace, admin_policy(namespace, row.admin))


def policy_condition(cluster: Cluster, namespace: str, pod: str) -> list[dict[str, Any]]:
    return [
        c
        for claim in claims_of(cluster, namespace, pod)
        for device in (claim.get("status") or {}).get("devices") or []
        for c in device.get("conditions") or []
        if c["type"] == CONDITION_POLICY
    ]


def server(template: str) -> dict[str, Any]:
    a = claiming_pod("a", template)  # answers "ok" on every connection
    a["metadata"]["labels"] = {"app": "db"}
    container = a["spec"]["containers"][0]
    container["command"] = ["nc", "-ll", "-p", str(PORT), "-e", "echo", "ok"]
    container["ports"] = [{"name": "http", "containerPort": PORT}]
    return a


def address_of(cluster: Cluster, namespace: str, pod: str) -> str:
    [found] = pod_addresses(cluster, namespace, pod, "net1")
    return found.partition("/")[0]


def pods_listed(driver: DriverProcess) -> float:
    """The LISTs of pods the driver's client made (network policy's, every namespace's)."""
    return sum(
        float(line.split()[-1])
        for line in driver.metrics().splitlines()
        if line.startswith("cnidra_apiserver_requests_total{")
        and 'verb="list"' in line
        and 'resource="pods"' in line
    )


def test_the_policy_matrix_holds_through_a_driver_restart(
    cluster: Cluster, attach: Callable[..., Attached]
) -> None:
    made = attach(SUBNET, pod="b")  # a client
    ns = made.namespace
    # no policy in the cluster: the driver lists and watches no pod but its node's
    # (cnidra.kube.netpolicy.PolicyGate); the first policy below makes it list them
    for kind in ("multi-networkpolicies", "cniadminnetworkpolicies"):
        assert not cluster.kubectl("get", kind, "-A", "-o", "name").stdout.strip(), kind
    assert made.driver.health().get("networkPolicySynced") is True
    assert pods_listed(made.driver) == 0
    d = claiming_pod("d", made.template)
    d["metadata"]["labels"] = {"app": "web"}
    apply(cluster, ns, d, server(made.template))
    cluster.kubectl("label", "pod", "-n", ns, "b", "app=web")
    for pod in ("a", "d"):
        ready(cluster, ns, pod)
    a = address_of(cluster, ns, "a")
    table: Sequence[Row] = rows(address_of(cluster, ns, "b"))
    try:
        cluster.wait(
            "a's claim to say where its policy is enforced",
            lambda: (
                [(c["status"], c["reason"]) for c in policy_condition(cluster, ns, "a")]
                == [("True", REASON_POLICY_POD_NAMESPACE)]
            ),
            30,
        )
        for row in table:
            in_force(cluster, ns, row)
            settles(made, a, row.expected, row.what)
        assert pods_listed(made.driver) >= 1
        # the driver stopped: the tables stay in the pods' namespaces; started again: read
        # back, still holding, and following the next change
        last = table[-1]
        made.driver.stop()
        assert probes(cluster, ns, a) == last.expected, ("the driver down", LAST)
        made.driver.start()
        cluster.wait(
            "the restarted driver's policy watches to sync",
            lambda: made.driver.health().get("networkPolicySynced") is True,
            60,
        )
        settles(made, a, last.expected, "the restarted driver to keep the admin's deny")
        in_force(cluster, ns, table[2])  # the named port from app=web again, no admin policy
        settles(made, a, table[2].expected, "the restarted driver to follow a change")
        # b relabelled: no longer app=web, no longer let in
        cluster.kubectl("label", "pod", "-n", ns, "b", "app=other", "--overwrite")
        settles(made, a, {"b": False, "d": True}, "b, relabelled, to be blocked")
    finally:
        cluster.kubectl(
            "delete", "cniadminnetworkpolicies", admin_name(ns), "--ignore-not-found", check=False
        )


PTP_SUBNET = "198.19.46.0/24"
PTP_CLASS = "ptp.test.cni.networking.x-k8s.io"


def ptp_class() -> dict[str, Any]:
    """An admin's class that lets claims define ptp networks addressed by cnidra's IPAM."""
    return admin_class(PTP_CLASS, {"defineNetworks": True, "plugins": ["ptp", "cnidra"]})


@pytest.fixture
def ptp_classed(cluster: Cluster, namespace: str) -> Iterator[str]:
    cluster.apply(ptp_class())
    cluster.kubectl(
        "annotate", "namespace", namespace, f"cni.networking.x-k8s.io/device-classes={PTP_CLASS}"
    )
    yield PTP_CLASS
    cluster.kubectl("delete", "deviceclass", PTP_CLASS, "--ignore-not-found", check=False)


def host_tables() -> list[str]:
    """cnidra's tables in the machine's namespace (node 1's), read only."""
    out = subprocess.run(
        ["nft", "list", "tables", "inet"], capture_output=True, text=True, check=True, timeout=10
    ).stdout
    return [line.split()[-1] for line in out.splitlines() if HOST_TABLE_PREFIX in line]


def test_ptp_is_enforced_on_the_hosts_end_where_the_pod_cannot_undo_it(
    cluster: Cluster,
    namespace: str,
    start_driver: Callable[..., DriverProcess],
    parent: str,
    ip_pools: Callable[..., str],
    ptp_classed: str,
) -> None:
    ns = namespace
    pool = ip_pools(PTP_SUBNET, ns, gateway="198.19.46.1")
    driver = start_driver()
    cluster.wait("the slice to carry the link", lambda: parent in slice_devices(cluster), 30)
    config = {
        "cniVersion": "1.1.0",
        "name": "pnet",
        "plugins": [{"type": "ptp", "ipam": {"type": "cnidra", "pool": pool}}],
    }
    net = device_template(
        "pnet", ptp_classed, [("net", select_link(parent), {"ifName": "net1", "config": config})]
    )
    a = server("pnet")
    b = claiming_pod("b", "pnet")
    b["metadata"]["labels"] = {"app": "web"}
    before = set(host_tables())
    apply(cluster, ns, net, a, b)
    for pod in ("a", "b"):
        ready(cluster, ns, pod)
    address = address_of(cluster, ns, "a")
    made = Attached(ns, parent, pool, driver, "b", "pnet")
    cluster.wait(
        "a's claim to say its policy is on the host's side",
        lambda: (
            [(c["status"], c["reason"]) for c in policy_condition(cluster, ns, "a")]
            == [("True", REASON_POLICY_HOST_SIDE)]
        ),
        30,
    )
    # no policy governs either pod: no table is made (one would accept everything)
    assert set(host_tables()) == before, set(host_tables()) - before
    only_b = {"b": True}
    settles_one(made, address, only_b, "b to reach a over ptp without a policy")
    deny = {"podSelector": DB}
    apply(cluster, ns, tenant_policy(ns, deny, "pnet"))
    settles_one(made, address, {"b": False}, "the default deny on a's host veth to block b")
    mine = set(host_tables()) - before
    assert len(mine) == 1, mine  # a's, on the host's end of its veth; b's governed by none
    # what a pod with CAP_NET_ADMIN could do to its own namespace: nothing of this holds there
    for pod in ("a", "b"):
        subprocess.run(
            ["nsenter", f"--net={sandbox_netns(cluster, ns, pod)}", "nft", "flush", "ruleset"],
            check=True,
            timeout=10,
        )
    assert probes_of(cluster, ns, address, ("b",)) == {"b": False}, LAST
    cluster.kubectl("delete", "multi-networkpolicies", "-n", ns, "db")
    settles_one(made, address, only_b, "b to reach a once the policy is gone")
    # the pods go: their tables on the host go too
    cluster.kubectl("delete", "pods", "-n", ns, "a", "b", "--timeout=90s", timeout=120)
    cluster.wait("the host's tables of a and b to go", lambda: not set(host_tables()) & mine, 30)


def probes_of(
    cluster: Cluster, namespace: str, address: str, clients: Sequence[str]
) -> dict[str, bool]:
    return {c: reaches(cluster, namespace, c, address) for c in clients}


def settles_one(made: Attached, address: str, expected: dict[str, bool], what: str) -> None:
    cluster, namespace = made.driver.cluster, made.namespace
    clients = tuple(expected)
    try:
        cluster.wait(
            what, lambda: probes_of(cluster, namespace, address, clients) == expected, WITHIN
        )
    except AssertionError as exc:
        log = [
            line
            for line in made.driver.log.read_text().splitlines()
            if "policy" in line.lower() or "Traceback" in line
        ]
        raise AssertionError(f"{exc}; the last probes: {LAST}; log: {log[-20:]}") from None
    assert probes_of(cluster, namespace, address, clients) == expected, (what, LAST)


def test_a_policy_that_selects_an_interface_it_cannot_enforce_says_so(
    cluster: Cluster,
    namespace: str,
    start_driver: Callable[..., DriverProcess],
    parent: str,
) -> None:
    ns = namespace
    cluster.apply(plugins_class())
    cluster.kubectl(
        "annotate", "namespace", ns, f"cni.networking.x-k8s.io/device-classes={TEST_CLASS}"
    )
    start_driver(cni_path=f"{cluster.env['CNIDRA_CNI_PATH']}:{FAULT_PLUGINS}")
    cluster.wait("the slice to carry the link", lambda: parent in slice_devices(cluster), 30)
    config = {"cniVersion": "1.1.0", "name": "fnet", "plugins": [{"type": "fault-del-fails"}]}
    net = device_template(
        "fnet", TEST_CLASS, [("net", select_link(parent), {"ifName": "net1", "config": config})]
    )
    a = claiming_pod("a", "fnet")
    a["metadata"]["labels"] = {"app": "db"}
    apply(cluster, ns, net, a, tenant_policy(ns, {"podSelector": DB}, "fnet"))
    ready(cluster, ns, "a")
    cluster.wait(
        "a's claim to say policy cannot be enforced on its interface",
        lambda: (
            [(c["status"], c["reason"]) for c in policy_condition(cluster, ns, "a")]
            == [("False", "NotEnforceable")]
        ),
        30,
    )

    def entries() -> list[dict[str, Any]]:
        status = cluster.get("multi-networkpolicies", "db", ns).get("status") or {}
        return list(status.get("nodes") or [])

    cluster.wait("node 1's entry in the policy's status", lambda: len(entries()) == 1, 30)
    [entry] = entries()
    [condition] = entry["conditions"]
    assert entry["node"] == NODE
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Enforced",
        "False",
        "NotEnforceable",
    )
    assert f"pod {ns}/a net1 (claim:{ns}/fnet)" in condition["message"], condition
    listed = cluster.kubectl("get", "multi-networkpolicies", "-n", ns, "db").stdout
    assert "NOT-ENFORCED-ON" in listed and NODE in listed, listed
    reasons = [e["reason"] for e in cluster.events("db", ns)]
    assert "NetworkPolicyNotEnforced" in reasons, reasons
    # the pod goes: node 1 has nothing more to say, and its entry goes
    cluster.kubectl("delete", "pod", "-n", ns, "a", "--timeout=90s", timeout=120)
    cluster.wait("node 1's entry to go", lambda: entries() == [], 30)
