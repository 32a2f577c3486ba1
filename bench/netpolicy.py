"""What network policy (issue 43) costs to compile and update at scale: 1,000 MultiNetworkPolicies
and 1,000 pods on one network, every pod on this node (the worst case for one node), compiled
with cnidra.api.netpolicy_rules; optionally (--nft, root) the largest table applied with nft in
a namespace of its own and then updated by a set change.

    python -m bench.netpolicy [--policies 1000] [--pods 1000] [--changes 10] [--nft]
                              [--agent] [--local-pods 20] [--json]

The shape: the pods spread over 50 namespaces (app=app0..app19 in each); per namespace one
default deny (`podSelector: {}`) and the rest one per app: ingress from the next app's pods and
from the namespaces labelled team=<even>, TCP 80 and the named port `http`, egress to an
ipBlock with an exception. Measured:

  full compile      every pod's table from scratch (a resync after a restart): seconds for the
                    node, per pod mean and p99, rules and set elements per pod
  address change    one pod moves: every pod's table compiled again and diffed against what
                    was applied (`Ruleset.update_from`), the time per change and how many pods'
                    tables change, by set element lines only
  policy change     one policy's ports edited: the same, and how many tables are rewritten
  indexed           the same kinds of change (and a pod's labels) through NetworkTables, which
                    recompiles only the tables a change can touch: ms per change, tables
                    compiled and changed
  nft (--nft)       the largest table applied whole, then one set update, in milliseconds
  agent (--agent)   through the agent's path (cnidra.nri.netpolicy.PolicyEnforcer, root): the
                    1,000 pods and policies fed as the watches feed them, `--local-pods` of
                    them on this node, each with a network namespace of its own and its table
                    applied there by nft; then a watch event (a policy selecting a local pod
                    edited; a peer every local table names moved) to the moment the enforcer's
                    task has committed every table it changes: p50 and p99 milliseconds, the
                    settle the task waits first included; CPU per change (the process's and
                    its nft children's, user and system); rules per local pod

"changes" recompiles every pod on the node per change (the naive way, for comparison);
"indexed" is what the agent uses (NetworkTables); "agent" is the agent itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

from cnidra.api.netpolicy import MultiNetworkPolicy, decode_policy
from cnidra.api.netpolicy_node import POLICY_NETWORK_KEY
from cnidra.api.netpolicy_rules import (
    NamedPort,
    NetworkView,
    PodInterface,
    PodOnNetwork,
    Ruleset,
    compile_pod,
)
from cnidra.api.netpolicy_state import NetworkTables, key_of

NETWORK = "bench/blue"
NAMESPACES = 50
APPS = 20


def pods(count: int) -> list[PodOnNetwork]:
    out = []
    for i in range(count):
        ns = f"ns{i % NAMESPACES}"
        app = f"app{(i // NAMESPACES) % APPS}"
        address = f"198.18.{i // 250}.{i % 250 + 1}"
        out.append(
            PodOnNetwork(ns, f"pod{i}", {"app": app}, (address,), (NamedPort("http", "TCP", 8080),))
        )
    return out


def policies(count: int) -> list[MultiNetworkPolicy]:
    out = []
    for doc in policy_docs(count):
        policy, issues = decode_policy(doc)
        assert policy is not None, issues.items
        out.append(policy)
    return out


def policy_docs(count: int) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        ns = f"ns{i % NAMESPACES}"
        k = (i // NAMESPACES) % APPS
        if k == 0:
            spec: dict[str, Any] = {"podSelector": {}}
        else:
            spec = {
                "podSelector": {"matchLabels": {"app": f"app{k}"}},
                "ingress": [
                    {
                        "from": [
                            {"podSelector": {"matchLabels": {"app": f"app{(k + 1) % APPS}"}}},
                            {"namespaceSelector": {"matchLabels": {"team": "even"}}},
                        ],
                        "ports": [{"port": 80}, {"port": "http"}],
                    }
                ],
                "egress": [
                    {"to": [{"ipBlock": {"cidr": "198.19.0.0/16", "except": ["198.19.7.0/24"]}}]}
                ],
            }
        doc = {
            "apiVersion": "k8s.cni.cncf.io/v1beta1",
            "kind": "MultiNetworkPolicy",
            "metadata": {
                "name": f"p{i}",
                "namespace": ns,
                "annotations": {"k8s.v1.cni.cncf.io/policy-for": NETWORK},
            },
            "spec": spec,
        }
        out.append(doc)
    return out


def view(all_pods: list[PodOnNetwork]) -> NetworkView:
    labels = {f"ns{i}": {"team": "even" if i % 2 == 0 else "odd"} for i in range(NAMESPACES)}
    return NetworkView(NETWORK, tuple(all_pods), labels)


def compile_all(
    all_pods: list[PodOnNetwork], pols: list[MultiNetworkPolicy]
) -> tuple[dict[str, Ruleset], list[float]]:
    v = view(all_pods)
    tables: dict[str, Ruleset] = {}
    times = []
    for pod in all_pods:
        t = time.perf_counter()
        tables[pod.name] = compile_pod(pod, [PodInterface("net1", v)], pols)
        times.append(time.perf_counter() - t)
    return tables, times


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.99))]


def changes(
    all_pods: list[PodOnNetwork],
    pols: list[MultiNetworkPolicy],
    applied: dict[str, Ruleset],
    n: int,
    rng: random.Random,
) -> dict[str, Any]:
    """`n` address changes, then `n` policy edits: each recompiles every pod and diffs."""
    out: dict[str, Any] = {}
    for kind in ("address", "policy"):
        seconds, touched, rewritten, lines = [], [], [], []
        for c in range(n):
            if kind == "address":
                i = rng.randrange(len(all_pods))
                old = all_pods[i]
                all_pods[i] = PodOnNetwork(
                    old.namespace, old.name, old.labels, (f"198.18.200.{c + 1}",), old.ports
                )
            else:
                j = rng.randrange(len(pols))
                p = pols[j]
                rules = tuple(type(r)(r.peers, r.ports[:1]) for r in p.ingress)
                pols[j] = MultiNetworkPolicy(
                    p.namespace, p.name, p.targets, p.pod_selector, rules, p.egress, p.policy_types
                )
            t = time.perf_counter()
            new, _ = compile_all(all_pods, pols)
            scripts = {name: rs.update_from(applied[name]) for name, rs in new.items()}
            seconds.append(time.perf_counter() - t)
            changed = {k: s for k, s in scripts.items() if s}
            touched.append(len(changed))
            rewritten.append(
                sum(s.startswith(("add table", "flush table")) for s in changed.values())
            )
            lines.append(sum(s.count("\n") for s in changed.values()))
            applied = new
        out[kind] = {
            "seconds_mean": statistics.mean(seconds),
            "seconds_max": max(seconds),
            "tables_changed_mean": statistics.mean(touched),
            "tables_rewritten_mean": statistics.mean(rewritten),
            "nft_lines_mean": statistics.mean(lines),
        }
    return out


def indexed(
    all_pods: list[PodOnNetwork], pols: list[MultiNetworkPolicy], n: int, rng: random.Random
) -> dict[str, Any]:
    """The same changes through cnidra.api.netpolicy_state.NetworkTables, which recompiles only
    the tables a change can touch (an address change: none, its sets are edited)."""
    v = view(all_pods)
    t = time.perf_counter()
    state = NetworkTables(
        NETWORK, {key_of(p): "net1" for p in all_pods}, all_pods, v.namespace_labels, pols
    )
    out: dict[str, Any] = {"build_seconds": time.perf_counter() - t}

    def measure(kind: str, event: Any) -> None:
        seconds, changed, compiles = [], [], []
        for c in range(n):
            before = state.compiles
            t = time.perf_counter()
            changed.append(len(event(c)))
            seconds.append(time.perf_counter() - t)
            compiles.append(state.compiles - before)
        out[kind] = {
            "ms_mean": statistics.mean(seconds) * 1000,
            "ms_max": max(seconds) * 1000,
            "tables_changed_mean": statistics.mean(changed),
            "tables_compiled_mean": statistics.mean(compiles),
        }

    def move(c: int) -> set[Any]:
        old = rng.choice(all_pods)
        pod = PodOnNetwork(old.namespace, old.name, old.labels, (f"198.18.201.{c + 1}",), old.ports)
        return state.set_pod(pod)

    def relabel(c: int) -> set[Any]:
        old = state.pods[key_of(rng.choice(all_pods))]
        pod = PodOnNetwork(
            old.namespace, old.name, {"app": f"app{rng.randrange(APPS)}"}, old.addresses, old.ports
        )
        return state.set_pod(pod)

    def edit(c: int) -> set[Any]:
        p = rng.choice(pols)
        rules = tuple(type(r)(r.peers, r.ports[: 1 + c % 2]) for r in p.ingress)
        return state.set_policy(
            MultiNetworkPolicy(
                p.namespace, p.name, p.targets, p.pod_selector, rules, p.egress, p.policy_types
            )
        )

    measure("address", move)
    measure("labels", relabel)
    measure("policy", edit)
    return out


def nft_timing(largest: Ruleset, update: Ruleset) -> dict[str, float]:
    from cnidra.cni import netns
    from cnidra.datapath import netpolicy

    with netns.temporary("cnidra-bench-np") as ns:
        t = time.perf_counter()
        netpolicy.apply(ns, largest)
        full = time.perf_counter() - t
        t = time.perf_counter()
        netpolicy.apply(ns, update, largest)
        incremental = time.perf_counter() - t
    return {"full_apply_ms": full * 1000, "set_update_ms": incremental * 1000}


def pod_object(pod: PodOnNetwork) -> dict[str, Any]:
    """The pod as the watch of pods gives it: labels, named ports, network-status."""
    status = [
        {
            "name": NETWORK,
            "interface": "net1",
            "ips": list(pod.addresses),
            POLICY_NETWORK_KEY: NETWORK,
        }
    ]
    return {
        "metadata": {
            "namespace": pod.namespace,
            "name": pod.name,
            "labels": dict(pod.labels),
            "annotations": {"k8s.v1.cni.cncf.io/network-status": json.dumps(status)},
        },
        "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running"},
    }


def agent(count_policies: int, count_pods: int, local: int, n: int) -> dict[str, Any]:
    """The agent's path, with real nft in a namespace per local pod (see the module doc)."""
    return asyncio.run(_agent(count_policies, count_pods, local, n))


def _record(pod: PodOnNetwork, space: str) -> Any:
    """A local pod's sandbox record: one macvlan interface on NETWORK (pod-side table)."""
    from cnidra.api.refs import ObjectRef
    from cnidra.cni.attach import Attachment
    from cnidra.state.sandboxes import Attached, SandboxRecord, State

    claim = ObjectRef(pod.namespace, f"c-{pod.name}", f"u-{pod.name}")
    att = Attachment(
        claim,
        "net",
        "net1",
        {"cniVersion": "1.0.0", "name": "blue", "plugins": [{"type": "macvlan"}]},
        "node",
        "eth1",
        policy_network=NETWORK,
    )
    result = {"cniVersion": "1.0.0", "ips": [{"address": f"{pod.addresses[0]}/16"}]}
    ref = ObjectRef(pod.namespace, pod.name, f"uid-{pod.name}")
    return SandboxRecord(f"sb-{pod.name}", ref, space, State.ADDED, (Attached(att, result),))


async def _timed(enforcer: Any, n: int, event: Any) -> dict[str, Any]:
    """`n` watch events, each timed to the moment the enforcer's task has applied what it
    changed (its `apply_dirty` returned), with the CPU it took (this process's threads and
    the nft children it waited for)."""
    import os

    finished = asyncio.Event()
    applied: list[int] = []
    inner = enforcer.apply_dirty

    async def traced() -> None:
        count = len(enforcer.dirty)
        await inner()
        applied.append(count)
        finished.set()

    enforcer.apply_dirty = traced
    seconds, cpu, tables = [], [], []
    try:
        for c in range(n):
            finished.clear()
            applied.clear()
            before = os.times()
            started = time.perf_counter()
            event(c)
            await asyncio.wait_for(finished.wait(), 60)
            seconds.append(time.perf_counter() - started)
            after = os.times()
            cpu.append(sum(after[:4]) - sum(before[:4]))  # user, system, children's both
            tables.append(sum(applied))
    finally:
        enforcer.apply_dirty = inner
    return {
        "ms_p50": statistics.median(seconds) * 1000,
        "ms_p99": p99(seconds) * 1000,
        "ms_max": max(seconds) * 1000,
        "cpu_ms_per_change_mean": statistics.mean(cpu) * 1000,
        "tables_applied_mean": statistics.mean(tables),
    }


async def _agent(count_policies: int, count_pods: int, local: int, n: int) -> dict[str, Any]:
    import contextlib
    import tempfile
    from pathlib import Path

    from cnidra.cni import netns
    from cnidra.nri.netpolicy import KINDS, PolicyEnforcer
    from cnidra.state.layout import StateLayout
    from cnidra.state.sandboxes import SandboxStore

    all_pods = pods(count_pods)
    docs = policy_docs(count_policies)
    # pods 50.. are app1 of ns0..: each selected by exactly one policy with rules (p50..)
    mine = all_pods[NAMESPACES : NAMESPACES + local]
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        store = SandboxStore(StateLayout(Path(tmp)))
        enforcer = PolicyEnforcer(store)  # the driver's settle
        objects = {
            "MultiNetworkPolicy": docs,
            "Namespace": [
                {"metadata": {"name": ns, "labels": labels}}
                for ns, labels in view(all_pods).namespace_labels.items()
            ],
            "Pod": [pod_object(p) for p in all_pods],
        }
        for kind in KINDS:
            enforcer.replace(kind, objects.get(kind, []))
        for pod in mine:
            record = _record(pod, str(stack.enter_context(netns.temporary("cnidra-bench-np"))))
            store.put_blocking(record)
            await enforcer.at_add(record, pod.labels, record.attachments[0].attachment, None)
        await enforcer.apply_dirty()
        rules = [
            rs.rule_count
            for key in enforcer.node.local
            if (rs := enforcer.node.ruleset(key, NETWORK)) is not None
        ]
        rng = random.Random(43)

        def edit(c: int) -> None:
            j = NAMESPACES + rng.randrange(local)  # the policy selecting local pod j
            doc = docs[j] = json.loads(json.dumps(docs[j]))
            ports = doc["spec"]["ingress"][0]["ports"]  # [80, http] <-> [80]: always a change
            doc["spec"]["ingress"][0]["ports"] = (
                ports[:1] if len(ports) == 2 else [*ports, {"port": "http"}]
            )
            enforcer.changed("MultiNetworkPolicy", "MODIFIED", doc)

        def move(c: int) -> None:
            peer = all_pods[0]  # ns0 is team=even: every local table names it
            moved = PodOnNetwork(
                peer.namespace, peer.name, peer.labels, (f"198.18.202.{c % 250 + 1}",), peer.ports
            )
            enforcer.changed("Pod", "MODIFIED", pod_object(moved))

        task = asyncio.create_task(enforcer.run())
        try:
            return {
                "local_pods": local,
                "settle_ms": enforcer.settle * 1000,
                "rules_per_local_pod_mean": statistics.mean(rules),
                "rules_per_local_pod_max": max(rules),
                "policy_change": await _timed(enforcer, n, edit),
                "peer_address_change": await _timed(enforcer, n, move),
            }
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--changes", type=int, default=10)
    ap.add_argument("--nft", action="store_true", help="apply the largest table with nft (root)")
    ap.add_argument(
        "--agent", action="store_true", help="change to enforcement through the agent (root)"
    )
    ap.add_argument("--local-pods", type=int, default=20, help="the agent's pods on this node")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = random.Random(43)
    all_pods = pods(args.pods)
    pols = policies(args.policies)
    t = time.perf_counter()
    tables, times = compile_all(all_pods, pols)
    total = time.perf_counter() - t
    rules = [rs.rule_count for rs in tables.values()]
    elements = [sum(len(s.elements) for s in rs.sets) for rs in tables.values()]
    largest_name = max(tables, key=lambda k: len(tables[k].script()))
    result: dict[str, Any] = {
        "policies": args.policies,
        "pods": args.pods,
        "full_compile_seconds": total,
        "per_pod_ms_mean": statistics.mean(times) * 1000,
        "per_pod_ms_p99": p99(times) * 1000,
        "rules_per_pod_mean": statistics.mean(rules),
        "rules_per_pod_max": max(rules),
        "set_elements_per_pod_mean": statistics.mean(elements),
        "largest_script_bytes": len(tables[largest_name].script()),
    }
    result["changes"] = changes(list(all_pods), list(pols), dict(tables), args.changes, rng)
    result["indexed"] = indexed(list(all_pods), list(pols), args.changes * 10, rng)
    if args.nft:
        moved = list(all_pods)
        moved[0] = PodOnNetwork(
            moved[0].namespace, moved[0].name, moved[0].labels, ("198.18.250.1",), moved[0].ports
        )
        v = view(moved)
        me = next(p for p in moved if p.name == largest_name)
        update = compile_pod(me, [PodInterface("net1", v)], pols)
        result["nft"] = nft_timing(tables[largest_name], update)
    if args.agent:
        result["agent"] = agent(args.policies, args.pods, args.local_pods, args.changes * 5)
    if args.json:
        print(json.dumps(result))  # one line: bench.run reads the last
        return
    for key, value in result.items():
        print(f"{key:28} {value}")


if __name__ == "__main__":
    main()
