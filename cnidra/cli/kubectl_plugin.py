"""`kubectl cnidra ...`: run `cnidra ...` in the driver pod of the right node, so the node API
(a root-only socket on each node) is one command away from a workstation:

    kubectl cnidra node describe POD -n NAMESPACE     # the node of POD
    kubectl cnidra node pods --node NODE [-n NS]      # a node by name
    kubectl cnidra node events --node NODE --follow

It finds the pod's node (`kubectl get pod`), the cnidra driver pod on that node (by the chart's
labels, in --driver-namespace, default cnidra-system) and runs `kubectl exec` into it; kubectl's
own --context and --kubeconfig are passed on. Exit codes are the command's; 2 for usage."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Sequence

DRIVER_SELECTOR = "app.kubernetes.io/name=cnidra"
DRIVER_CONTAINER = "driver"
POD_COMMANDS = ("describe", "attach", "detach")  # take a pod name: its node is the target
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
    parser.add_argument("--context")
    parser.add_argument("--kubeconfig")
    parser.add_argument("-n", "--namespace")
    parser.add_argument("-h", "--help", action="store_true")
    known, rest = parser.parse_known_args(args)
    if known.help or not rest:
        print(__doc__)
        return 0 if known.help else EXIT_USAGE
    if shutil.which("kubectl") is None:
        raise Usage("kubectl is not on PATH")
    kubectl = ["kubectl"]
    if known.context:
        kubectl += ["--context", known.context]
    if known.kubeconfig:
        kubectl += ["--kubeconfig", known.kubeconfig]
    node = known.node or _node_of_pod(kubectl, rest, known.namespace)
    driver = _driver_pod(kubectl, node, known.driver_namespace)
    command = list(rest)
    if known.namespace:
        command += ["-n", known.namespace]
    exec_ = [
        *kubectl, "exec", "-n", known.driver_namespace, driver, "-c", DRIVER_CONTAINER,
        *(["-i", "-t"] if sys.stdin.isatty() and "--follow" in rest else []),
        "--", "cnidra", *command,
    ]  # fmt: skip
    return subprocess.run(exec_, check=False).returncode


def _node_of_pod(kubectl: list[str], rest: list[str], namespace: str | None) -> str:
    if len(rest) < 3 or rest[0] != "node" or rest[1] not in POD_COMMANDS:
        raise Usage(
            "say which node: --node NODE, or a pod (kubectl cnidra node describe POD -n NS)"
        )
    pod = rest[2]
    out = _kubectl(
        [*kubectl, "get", "pod", pod, *(["-n", namespace] if namespace else []),
         "-o", "jsonpath={.spec.nodeName}"],
        f"pod {pod}",
    )  # fmt: skip
    if not out:
        raise Usage(f"pod {pod} is not scheduled to a node yet")
    return out


def _driver_pod(kubectl: list[str], node: str, namespace: str) -> str:
    out = _kubectl(
        [*kubectl, "get", "pods", "-n", namespace, "-l", DRIVER_SELECTOR,
         "--field-selector", f"spec.nodeName={node}", "-o", "jsonpath={.items[*].metadata.name}"],
        f"the cnidra driver pod on node {node}",
    )  # fmt: skip
    if not out:
        raise Usage(
            f"no cnidra driver pod on node {node} in namespace {namespace} (is the chart "
            "installed there? --driver-namespace names another)"
        )
    return out.split()[0]


def _kubectl(cmd: list[str], what: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise Usage(f"cannot find {what}: {done.stderr.strip() or 'kubectl failed'}")
    return done.stdout.strip()
