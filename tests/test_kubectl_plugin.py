"""`kubectl cnidra`: finds the pod's node and the driver pod there, and runs `cnidra` in it;
every wrong input is a message and exit 2 (a fake kubectl on PATH records the calls)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cnidra.cli.kubectl_plugin import main

FAKE = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
def driver(name, node, phase="Running", container="driver", command=("cnidra", "driver")):
    # labels as a chart installed with nameOverride=netdra makes them
    return {"metadata": {"name": name, "labels": {"app.kubernetes.io/name": "netdra"}},
            "spec": {"nodeName": node, "containers": [
                {"name": container, "command": list(command)}]},
            "status": {"phase": phase}}
DRIVERS = [
    driver("old-node-b", "node-b", phase="Pending"),
    driver("cnidra-node-b-x", "node-b"),
    driver("cnidra-node-a-x", "node-a"),
    driver("cnidra-n1-x", "n1"),
    driver("webhook-node-b", "node-b", container="webhook", command=("cnidra", "webhook")),
]
if "get" in args and "pod" in args:
    pod = args[args.index("pod") + 1]
    if pod == "missing":
        print('Error from server (NotFound): pods "missing" not found', file=sys.stderr)
        sys.exit(1)
    print("" if pod == "pending" else "node-b", end="")
elif "get" in args and "pods" in args and "json" in args:
    namespace = args[args.index("-n") + 1]
    items = DRIVERS if namespace in ("cnidra-system", "net") else []
    if "-l" in args:
        key, value = args[args.index("-l") + 1].split("=")
        items = [i for i in items if i["metadata"]["labels"].get(key) == value]
    print(json.dumps({"items": items}))
elif "get" in args and "pods" in args:
    namespace = args[args.index("-n") + 1]
    print({"shop": "node-a node-b node-a", "lost": "nowhere"}.get(namespace, ""), end="")
elif "exec" in args:
    print("ran", " ".join(args[args.index("--") + 1:]))
    sys.exit(3)
"""


@pytest.fixture
def kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake = tmp_path / "bin" / "kubectl"
    fake.parent.mkdir()
    fake.write_text(FAKE)
    fake.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def execs(log: Path) -> list[list[str]]:
    return [c[c.index("exec") + 1 :] for c in calls(log) if "exec" in c]


def test_a_pods_node_and_its_driver_pod_are_found(
    kubectl: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = main(["node", "describe", "web-0", "-n", "shop", "--context", "prod"])
    assert code == 3  # the command's own exit code
    get_drivers, get_pod, exec_ = calls(kubectl)
    assert get_pod[:2] == ["--context", "prod"] and "web-0" in get_pod and "shop" in get_pod
    assert "cnidra-system" in get_drivers and "-l" not in get_drivers  # no label assumed
    assert exec_[exec_.index("exec") + 1 :] == [
        "-n", "cnidra-system", "cnidra-node-b-x", "-c", "driver",
        "--", "cnidra", "node", "describe", "web-0", "-n", "shop",
    ]  # fmt: skip
    assert "ran cnidra node describe web-0 -n shop" in capfd.readouterr().out


def test_a_node_by_name(kubectl: Path) -> None:
    assert main(["--node", "n1", "node", "pods", "--driver-namespace", "net"]) == 3
    [exec_] = execs(kubectl)
    assert exec_[:3] == ["-n", "net", "cnidra-n1-x"]


def test_pods_of_a_namespace_ask_each_node_that_runs_one(
    kubectl: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`kubectl cnidra node pods -n NS`, as `cnidra node --help` suggests: every node that runs
    a pod of NS, one after another, each named on stderr."""
    assert main(["node", "pods", "-n", "shop"]) == 3
    assert [e[2] for e in execs(kubectl)] == ["cnidra-node-a-x", "cnidra-node-b-x"]
    assert all(e[-4:] == ["node", "pods", "-n", "shop"] for e in execs(kubectl))
    err = capfd.readouterr().err
    assert "# node node-a" in err and "# node node-b" in err


def test_pods_without_a_namespace_ask_every_driver(kubectl: Path) -> None:
    assert main(["node", "pods"]) == 3
    assert [e[2] for e in execs(kubectl)] == ["cnidra-n1-x", "cnidra-node-a-x", "cnidra-node-b-x"]


def test_the_driver_is_found_whatever_its_labels(kubectl: Path) -> None:
    """nameOverride renames the chart's labels; the driver is the pod whose `driver` container
    runs `cnidra driver` (a running one before one still pending), never the webhook's."""
    assert main(["--node", "node-b", "node", "pods"]) == 3
    [exec_] = execs(kubectl)
    assert exec_[2] == "cnidra-node-b-x"
    assert main(["--node", "n1", "--driver-selector", "app.kubernetes.io/name=netdra",
                 "node", "pods"]) == 3  # fmt: skip
    assert execs(kubectl)[-1][2] == "cnidra-n1-x"


def test_events_of_a_pod_go_to_its_node(kubectl: Path) -> None:
    assert main(["node", "events", "web-0", "-n", "shop"]) == 3
    [exec_] = execs(kubectl)
    assert exec_[2] == "cnidra-node-b-x"


def test_a_namespace_with_no_pods_on_nodes_says_so(
    kubectl: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(["node", "pods", "-n", "idle"]) == 0
    assert "no pod of namespace idle is on a node" in capfd.readouterr().err
    assert execs(kubectl) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["node", "describe", "missing", "-n", "x"], 'pods "missing" not found'),
        (["node", "describe", "pending"], "not scheduled to a node yet"),
        (["node", "describe"], "say which pod"),
        (["--node", "empty", "node", "pods"], "no cnidra driver pod on node empty"),
        (["node", "pods", "-n", "lost"], "no cnidra driver pod on node nowhere"),
        (["node", "pods", "--driver-namespace", "other"], "no cnidra driver pod on any node"),
        (["node", "events", "--follow"], "--follow follows one node's events"),
        (["migrate-state"], "say which node"),
    ],
)
def test_wrong_input_is_a_message_and_exit_2(
    kubectl: Path, capfd: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(argv) == 2
    err = capfd.readouterr().err
    assert message in err and "Traceback" not in err


def test_what_cnidra_node_help_suggests_runs(kubectl: Path) -> None:
    """`cnidra node --help` tells users to run `kubectl cnidra node pods -n NAMESPACE` from
    their machine: the plugin runs exactly that (here with NAMESPACE shop)."""
    import re

    from typer.testing import CliRunner

    from cnidra.cli.main import app

    help = " ".join(
        CliRunner().invoke(app, ["node", "--help"], env={"COLUMNS": "300"}).output.split()
    )
    suggested = re.findall(r"`(kubectl cnidra node [^`]+)`", help)
    assert "kubectl cnidra node pods -n NAMESPACE" in suggested, help
    for command in suggested:
        argv = command.replace("NAMESPACE", "shop").replace("POD", "web-0").split()[2:]
        assert main(argv) == 3, command  # the command ran in a driver pod (its exit code)


def test_no_kubectl_and_no_arguments(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main([]) == 2 and "kubectl cnidra node describe" in capfd.readouterr().out
    assert main(["--help"]) == 0
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["--node", "n", "node", "pods"]) == 2
    assert "kubectl is not on PATH" in capfd.readouterr().err
