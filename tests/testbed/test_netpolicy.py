"""Issue 43 on the test bed: two pods on a macvlan network of node 1 (a claim-defined network,
`claim:<namespace>/net`), the driver as deploy/ runs it (network policy on), and real TCP
(busybox nc serving in pod a, nc from pod b through `kubectl exec`) before and after a
MultiNetworkPolicy default-denies a's ingress, then allows it from `podSelector: app=web`, then
b's label changes. Each probe's expected result is asserted, and waited for no longer than the
enforcement takes plus the exec's own time.

Only the test's own link (a host-only bridge) and 198.19.43.0/24 (inside 198.18.0.0/15)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from testbed.harness import Cluster
from tests.testbed.conftest import Attached
from tests.testbed.objects import apply, claiming_pod, pod_addresses, ready

pytestmark = pytest.mark.testbed

SUBNET = "198.19.43.0/24"
PORT = 8080
# the policy reaches the pods' tables within a second; each probe is a kubectl exec
WITHIN = 30.0


def policy(namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1beta1",
        "kind": "MultiNetworkPolicy",
        "metadata": {
            "name": "db",
            "namespace": namespace,
            "annotations": {"k8s.v1.cni.cncf.io/policy-for": f"claim:{namespace}/net"},
        },
        "spec": spec,
    }


LAST: list[str] = []  # the last probe's output, for a failure's message


def reaches(cluster: Cluster, namespace: str, address: str) -> bool:
    """A TCP connection from b to a's server, and its answer (busybox's nc: its wget crashes)."""
    out = cluster.kubectl(
        "exec", "-n", namespace, "b", "--", "nc", "-w", "3", address, str(PORT),
        check=False, input_="",
    )  # fmt: skip
    LAST[:] = [f"rc {out.returncode}: {out.stdout.strip()} {out.stderr.strip()}"]
    return out.returncode == 0 and "ok" in out.stdout


def settles(made: Attached, address: str, expected: bool, what: str) -> None:
    cluster, namespace = made.driver.cluster, made.namespace
    try:
        cluster.wait(what, lambda: reaches(cluster, namespace, address) == expected, WITHIN)
    except AssertionError as exc:
        ping = cluster.kubectl(
            "exec", "-n", namespace, "b", "--", "ping", "-c", "1", "-W", "2", address, check=False
        )  # fmt: skip
        log = [
            line
            for line in made.driver.log.read_text().splitlines()
            if "policy" in line.lower() or "Traceback" in line
        ]
        raise AssertionError(
            f"{exc}; the last probe: {LAST}; ping rc {ping.returncode}; synced "
            f"{made.driver.health().get('networkPolicySynced')}; the driver's log: {log[-20:]}"
        ) from None
    # and stays so (not a probe that happened to pass during a change)
    assert reaches(cluster, namespace, address) == expected, (what, LAST)


def test_a_multinetworkpolicy_default_deny_then_an_allow_by_pod_selector(
    cluster: Cluster, attach: Callable[..., Attached]
) -> None:
    made = attach(SUBNET, pod="b")  # the client
    ns = made.namespace
    cluster.kubectl("label", "pod", "-n", ns, "b", "app=web")
    a = claiming_pod("a", made.template)  # the server: answers "ok" on every connection
    a["metadata"]["labels"] = {"app": "db"}
    a["spec"]["containers"][0]["command"] = ["nc", "-ll", "-p", str(PORT), "-e", "echo", "ok"]
    apply(cluster, ns, a)
    ready(cluster, ns, "a")
    [a_address] = pod_addresses(cluster, ns, "a", "net1")
    address = a_address.partition("/")[0]
    # no policy: b reaches a
    settles(made, address, True, "b to reach a without a policy")
    # default deny ingress for a (app=db)
    apply(cluster, ns, policy(ns, {"podSelector": {"matchLabels": {"app": "db"}}}))
    settles(made, address, False, "the default deny to block b")
    # allow from app=web: b (app=web) reaches a again
    allow = {"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}
    apply(
        cluster, ns, policy(ns, {"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [allow]})
    )
    settles(made, address, True, "the allow by podSelector to let b in")
    # b's label changes: no longer selected by the rule
    cluster.kubectl("label", "pod", "-n", ns, "b", "app=other", "--overwrite")
    settles(made, address, False, "b, relabelled, to be blocked")
    # the policy goes: open again
    cluster.kubectl("delete", "multi-networkpolicies", "-n", ns, "db")
    settles(made, address, True, "b to reach a once the policy is gone")
