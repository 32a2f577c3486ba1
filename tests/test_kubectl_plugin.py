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
if "get" in args and "pod" in args:
    pod = args[args.index("pod") + 1]
    if pod == "missing":
        print('Error from server (NotFound): pods "missing" not found', file=sys.stderr)
        sys.exit(1)
    print("" if pod == "pending" else "node-b", end="")
elif "get" in args and "pods" in args:
    node = [a for a in args if a.startswith("spec.nodeName=")][0].split("=", 1)[1]
    print("" if node == "empty" else f"cnidra-{node}-x cnidra-{node}-y", end="")
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


def test_a_pods_node_and_its_driver_pod_are_found(
    kubectl: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code = main(["node", "describe", "web-0", "-n", "shop", "--context", "prod"])
    assert code == 3  # the command's own exit code
    get_pod, get_driver, exec_ = calls(kubectl)
    assert get_pod[:2] == ["--context", "prod"] and "web-0" in get_pod and "shop" in get_pod
    assert "spec.nodeName=node-b" in get_driver and "cnidra-system" in get_driver
    assert exec_[exec_.index("exec") + 1 :] == [
        "-n", "cnidra-system", "cnidra-node-b-x", "-c", "driver",
        "--", "cnidra", "node", "describe", "web-0", "-n", "shop",
    ]  # fmt: skip
    assert "ran cnidra node describe web-0 -n shop" in capfd.readouterr().out


def test_a_node_by_name(kubectl: Path) -> None:
    assert main(["--node", "n1", "node", "pods", "--driver-namespace", "net"]) == 3
    get_driver, exec_ = calls(kubectl)
    assert "spec.nodeName=n1" in get_driver and exec_[exec_.index("-n") + 1] == "net"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["node", "pods"], "say which node"),
        (["node", "describe", "missing", "-n", "x"], 'pods "missing" not found'),
        (["node", "describe", "pending"], "not scheduled to a node yet"),
        (["--node", "empty", "node", "pods"], "no cnidra driver pod on node empty"),
    ],
)
def test_wrong_input_is_a_message_and_exit_2(
    kubectl: Path, capfd: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(argv) == 2
    err = capfd.readouterr().err
    assert message in err and "Traceback" not in err


def test_no_kubectl_and_no_arguments(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main([]) == 2 and "kubectl cnidra node describe" in capfd.readouterr().out
    assert main(["--help"]) == 0
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["--node", "n", "node", "pods"]) == 2
    assert "kubectl is not on PATH" in capfd.readouterr().err
