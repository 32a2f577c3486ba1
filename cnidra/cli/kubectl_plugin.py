"""`kubectl cnidra ...`: run `cnidra ...` in the driver pod of the right node, so the node API
(a root-only socket on each node) is one command away from a workstation:

    kubectl cnidra node describe POD -n NAMESPACE     # the node of POD
    kubectl cnidra node pods -n NAMESPACE             # every node that runs a pod of NAMESPACE
    kubectl cnidra node pods                          # every node with a cnidra driver
    kubectl cnidra node pods --node NODE [-n NS]      # a node by name
    kubectl cnidra node events --node NODE --follow

It finds the node (the pod's, by `kubectl get pod`; a namespace's pods' nodes; or all), the
cnidra driver pod on each (in --driver-namespace, default cnidra-system: the pod whose
container `driver` runs `cnidra driver`, whatever the chart's nameOverride made its labels;
--driver-selector LABELS narrows it) and runs `kubectl exec` into it, one node after another
(a line `# node NODE` on stderr before each when there are several); kubectl's own --context
and --kubeconfig are passed on. Exit codes are the command's (the highest of several); 2 for
usage."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

DRIVER_CONTAINER = "driver"
POD_COMMANDS = ("describe", "attach", "detach")  # take a pod name: its node is the target
NODE_COMMANDS = ("pods", "events", *POD_COMMANDS)
EXIT_USAGE = 2


class Usage(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except Usage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except subprocess.TimeoutExpired:
        print("error: kubectl did not answer in time", file=sys.stderr)
        return 1


def run(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kubectl cnidra", add_help=False)
    parser.add_argument("--node")
    parser.add_argument("--driver-namespace", default="cnidra-system")
    parser.add_argument("--driver-selector")
    parser.add_argument("--context")
    parser.add_argument("--kubeconfig")
    parser.add_argument("-n", "--namespace")
    parser.add_argument("-h", "--help", action="store_true")
    known, rest = parser.parse_known_args(args)
    if known.help or not rest:
        print(__doc__)
        return 0 if known.help else EXIT_USAGE
    if (rest[0] != "node" or len(rest) < 2) and not known.node:
        raise Usage(
            "say which node: --node NODE, or run a node command that names it "
            f"(kubectl cnidra node {'|'.join(NODE_COMMANDS)} ...; see kubectl cnidra --help)"
        )
    if shutil.which("kubectl") is None:
        raise Usage("kubectl is not on PATH")
    kubectl = ["kubectl"]
    if known.context:
        kubectl += ["--context", known.context]
    if known.kubeconfig:
        kubectl += ["--kubeconfig", known.kubeconfig]
    drivers = _driver_pods(kubectl, known.driver_namespace, known.driver_selector)
    nodes = _nodes(kubectl, rest, known.node, known.namespace, drivers, known.driver_namespace)
    if not nodes:
        print(f"no pod of namespace {known.namespace} is on a node", file=sys.stderr)
        return 0
    if len(nodes) > 1 and any(f in rest for f in ("--follow", "-f")):
        raise Usage(
            "--follow follows one node's events: say which with --node NODE (nodes: "
            f"{', '.join(nodes)})"
        )
    command = list(rest)
    if known.namespace:
        command += ["-n", known.namespace]
    code = 0
    for node in nodes:
        if len(nodes) > 1:
            print(f"# node {node}", file=sys.stderr, flush=True)
        exec_ = [
            *kubectl, "exec", "-n", known.driver_namespace, drivers[node], "-c",
            DRIVER_CONTAINER, *(["-i", "-t"] if sys.stdin.isatty() and "--follow" in rest else []),
            "--", "cnidra", *command,
        ]  # fmt: skip
        code = max(code, subprocess.run(exec_, check=False).returncode)
    return code


def _nodes(
    kubectl: list[str],
    rest: list[str],
    node: str | None,
    namespace: str | None,
    drivers: dict[str, str],
    driver_namespace: str,
) -> list[str]:
    """The nodes to ask: the one named, the pod's, the nodes of a namespace's pods, or every
    node with a driver; each must have a driver pod."""
    if node:
        wanted = [node]
    elif rest[1] in POD_COMMANDS or (
        rest[1] == "events" and len(rest) > 2 and not rest[2].startswith("-")
    ):  # events POD: that pod's node
        wanted = [_node_of_pod(kubectl, rest, namespace)]
    elif namespace:
        out = _kubectl(
            [*kubectl, "get", "pods", "-n", namespace, "-o", "jsonpath={.items[*].spec.nodeName}"],
            f"the pods of namespace {namespace}",
        )
        wanted = sorted(set(out.split()))
    else:
        wanted = sorted(drivers)
        if not wanted:
            raise Usage(_no_driver("any node", driver_namespace))
    for name in wanted:
        if name not in drivers:
            raise Usage(_no_driver(f"node {name}", driver_namespace))
    return wanted


def _no_driver(where: str, namespace: str) -> str:
    return (
        f"no cnidra driver pod on {where} in namespace {namespace} (is the chart installed "
        "there? --driver-namespace names another)"
    )


def _node_of_pod(kubectl: list[str], rest: list[str], namespace: str | None) -> str:
    if len(rest) < 3 or rest[2].startswith("-"):
        raise Usage(f"say which pod: kubectl cnidra node {rest[1]} POD -n NS")
    pod = rest[2]
    out = _kubectl(
        [*kubectl, "get", "pod", pod, *(["-n", namespace] if namespace else []),
         "-o", "jsonpath={.spec.nodeName}"],
        f"pod {pod}",
    )  # fmt: skip
    if not out:
        raise Usage(f"pod {pod} is not scheduled to a node yet")
    return out


def _driver_pods(kubectl: list[str], namespace: str, selector: str | None) -> dict[str, str]:
    """node -> the cnidra driver pod there (a running one first): a pod of `namespace` whose
    container `driver` runs `cnidra driver`. Found by what it runs, not by a label: the
    chart's nameOverride changes its labels."""
    out = _kubectl(
        [*kubectl, "get", "pods", "-n", namespace, *(["-l", selector] if selector else []),
         "-o", "json"],
        f"the cnidra driver pods in namespace {namespace}",
    )  # fmt: skip
    try:
        items = json.loads(out or "{}").get("items") or []
    except (ValueError, AttributeError):
        raise Usage(f"kubectl get pods -n {namespace} gave no JSON list of pods") from None
    found: dict[str, tuple[bool, str]] = {}
    for pod in items if isinstance(items, list) else []:
        if not isinstance(pod, dict) or not _is_driver(pod):
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        name = (pod.get("metadata") or {}).get("name")
        if not isinstance(node, str) or not isinstance(name, str):
            continue
        running = (pod.get("status") or {}).get("phase") == "Running"
        if node not in found or (running and not found[node][0]):
            found[node] = (running, name)
    return {node: name for node, (_, name) in found.items()}


def _is_driver(pod: dict[str, Any]) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or []
    for c in containers if isinstance(containers, list) else []:
        if not isinstance(c, dict) or c.get("name") != DRIVER_CONTAINER:
            continue
        words = [*(c.get("command") or []), *(c.get("args") or [])]
        text = [str(w).rsplit("/", 1)[-1] for w in words]
        if "cnidra" in text and "driver" in text:
            return True
    return False


def _kubectl(cmd: list[str], what: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise Usage(f"cannot find {what}: {done.stderr.strip() or 'kubectl failed'}")
    return done.stdout.strip()
