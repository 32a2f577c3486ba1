"""The container gate: the real script, run as runc runs a createRuntime hook (the OCI state on
stdin), against records the real SandboxStore writes; and the CDI device that carries it."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cnidra.api.refs import ObjectRef
from cnidra.cni.attach import Attachment
from cnidra.dra.prepare import PrepareError, Preparer
from cnidra.state import gate
from cnidra.state.checkpoint import Checkpoint
from cnidra.state.layout import StateLayout
from cnidra.state.sandboxes import Attached, SandboxRecord, SandboxStore, State
from cnidra.status.metadata import DeviceMetadata
from tests.dra.test_prepare import DIRS, VIEW, Claims, named

POD = ObjectRef("ns", "web-0", "pod-uid")


def oci_state(sandbox: str | None) -> bytes:
    annotations = {"io.kubernetes.cri.container-type": "container", "io.kubernetes.pod.name": "x"}
    if sandbox is not None:
        annotations["io.kubernetes.cri.sandbox-id"] = sandbox
    return json.dumps(
        {"ociVersion": "1.2.1", "id": "c1", "status": "creating", "pid": 42,
         "bundle": "/run/x", "annotations": annotations}
    ).encode()  # fmt: skip


def run_gate(
    layout: StateLayout, sandbox: str | None, wait: int = 1
) -> subprocess.CompletedProcess[bytes]:
    gate.install(layout.gate)
    argv = gate.hook_args(layout.gate, layout.sandboxes, wait)
    return subprocess.run(
        argv, input=oci_state(sandbox), capture_output=True, timeout=30, check=False
    )


def record(state: State, config_name: str = "data") -> SandboxRecord:
    plugin = {"type": "macvlan", "state": "added", "note": '"state":"added"'}
    hostile = {"cniVersion": "1.0.0", "name": config_name, "plugins": [plugin]}
    att = Attachment(ObjectRef("ns", "c", "cu"), "r0", "net1", hostile, "n1", "eth1")
    return SandboxRecord("sb1", POD, "/var/run/netns/x", state, (Attached(att),))


@pytest.mark.parametrize("state", [State.ADDING, State.DELETING])
async def test_a_container_is_refused_until_its_pods_record_says_added(
    tmp_path: Path, state: State
) -> None:
    layout = StateLayout(tmp_path)
    store = SandboxStore(layout)
    # a tenant's config spelling the words the gate looks for does not open it
    await store.put(record(state))
    started = time.monotonic()
    refused = run_gate(layout, "sb1", wait=1)
    assert refused.returncode != 0 and time.monotonic() - started >= 0.8  # it waited, bounded
    assert b"secondary interfaces are not attached (sandbox sb1" in refused.stderr
    await store.put(record(State.ADDED))
    assert run_gate(layout, "sb1").returncode == 0


def test_it_lets_the_container_go_as_soon_as_the_hook_records_the_pod(tmp_path: Path) -> None:
    layout = StateLayout(tmp_path)
    store = SandboxStore(layout)
    store.put_blocking(record(State.ADDING))
    gate.install(layout.gate)
    proc = subprocess.Popen(
        gate.hook_args(layout.gate, layout.sandboxes, 10),
        stdin=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(oci_state("sb1"))
    proc.stdin.close()
    time.sleep(0.5)
    store.put_blocking(record(State.ADDED))
    started = time.monotonic()
    assert proc.wait(30) == 0
    # as soon as the record says so (it looks every 0.2 s), not at the end of its 10 s: half
    # of them is the bound, not 1 s, which a loaded machine can take to wake a shell
    assert time.monotonic() - started < 5


def test_no_record_or_no_sandbox_id_is_refused(tmp_path: Path) -> None:
    layout = StateLayout(tmp_path)
    layout.sandboxes.mkdir(parents=True)
    assert run_gate(layout, "unknown").returncode != 0
    missing = run_gate(layout, None)
    assert missing.returncode != 0 and b"no sandbox ID" in missing.stderr
    assert run_gate(layout, "../../etc/passwd").returncode != 0  # only an ID's characters


def test_the_records_head_is_alone_on_its_first_line(tmp_path: Path) -> None:
    """What the gate reads: the head, with no tenant-written byte, on the first line; the
    whole file is still the record."""
    layout = StateLayout(tmp_path)
    SandboxStore(layout).put_blocking(record(State.ADDING))
    raw = (layout.sandboxes / "sb1.json").read_text()
    first, rest = raw.split("\n", 1)
    assert "attachments" not in first and '"state":"adding"' in first
    assert rest.startswith('"attachments":') and "\n" not in rest
    assert json.loads(raw) == record(State.ADDING).to_json()


@pytest.mark.parametrize("state", [State.ADDING, State.ADDED])
def test_a_record_written_before_the_head_line_is_judged_on_its_head(
    tmp_path: Path, state: State
) -> None:
    """A record the driver wrote before an upgrade is one line; a tenant's config in its
    attachments spelling "state":"added" still does not open the gate."""
    layout = StateLayout(tmp_path)
    layout.sandboxes.mkdir(parents=True)
    one_line = json.dumps(record(state).to_json(), separators=(",", ":"))
    assert '"state":"added"' in one_line.split('"attachments"', 1)[1]  # the tenant's words
    (layout.sandboxes / "sb1.json").write_text(one_line)
    assert (run_gate(layout, "sb1").returncode == 0) is (state == State.ADDED)


@pytest.mark.parametrize(
    "layout_of_state",
    [
        '{"annotations":{"io.kubernetes.cri.sandbox-id" : "sb1"}}',
        '{"annotations":{"a":"io.kubernetes.cri.sandbox-id","io.kubernetes.cri.sandbox-id":"sb1"}}',
        '{"annotations":{"a":"x\\",\\"io.kubernetes.cri.sandbox-id\\":\\"sb2","io.kubernetes.cri.sandbox-id":"sb1"}}',
    ],
)
def test_the_sandbox_id_is_the_keys_value_and_no_other(
    tmp_path: Path, layout_of_state: str
) -> None:
    """Blanks around the colon; the key's words as a value, or inside an escaped string,
    before the real key: the ID is still the real key's value (sb2 is added, sb1 is not)."""
    layout = StateLayout(tmp_path)
    store = SandboxStore(layout)
    store.put_blocking(record(State.ADDING))
    store.put_blocking(replace(record(State.ADDED), sandbox_id="sb2"))
    gate.install(layout.gate)
    argv = gate.hook_args(layout.gate, layout.sandboxes, 1)
    run = subprocess.run(
        argv, input=layout_of_state.encode(), capture_output=True, timeout=30, check=False
    )
    assert run.returncode != 0 and b"(sandbox sb1," in run.stderr


def test_every_claims_cdi_device_carries_the_gate(tmp_path: Path) -> None:
    argv = gate.hook_args(
        Path("/var/lib/cnidra/bin/cnidra-gate"), Path("/var/lib/cnidra/sandboxes")
    )
    for mounts in (True, False):
        cdi = tmp_path / f"cdi-{mounts}"
        metadata = DeviceMetadata(tmp_path / "plugin", cdi, mounts=mounts, gate=argv)
        checkpoint = Checkpoint(StateLayout(tmp_path / f"state-{mounts}"))
        preparer = Preparer(
            "n1", Claims(named("c", "u-1", 1)), checkpoint, DIRS, view=lambda: VIEW,
            metadata=metadata,
        )  # fmt: skip
        import asyncio

        asyncio.run(preparer.prepare(ObjectRef("ns", "c", "u-1")))
        [spec] = [json.loads(p.read_text()) for p in cdi.glob("*.json")]
        edits = spec["devices"][0]["containerEdits"]
        assert edits["hooks"] == [
            {"hookName": "createRuntime", "path": argv[0], "args": argv, "timeout": 30}
        ]
        assert ("mounts" in edits) is mounts


async def test_prepare_refuses_while_the_node_cannot_attach(tmp_path: Path) -> None:
    checkpoint = Checkpoint(StateLayout(tmp_path))
    preparer = Preparer("n1", Claims(named("c", "u-1", 1)), checkpoint, DIRS, view=lambda: VIEW)
    preparer.unready = lambda: "cnidra's NRI connection to the container runtime is down"
    [answer] = await preparer.prepare_batch([ObjectRef("ns", "c", "u-1")])
    assert isinstance(answer, PrepareError) and "NRI connection" in str(answer)
    assert checkpoint.get("u-1") is None
    preparer.unready = lambda: None
    [answer] = await preparer.prepare_batch([ObjectRef("ns", "c", "u-1")])
    assert not isinstance(answer, PrepareError)


async def test_a_restart_writes_every_prepared_claims_cdi_spec_again(tmp_path: Path) -> None:
    """/var/run/cdi is emptied by a reboot (tmpfs) while the checkpoint stays; an upgrade adds
    the gate to claims prepared before it."""
    argv = gate.hook_args(tmp_path / "gate", tmp_path / "sandboxes")
    cdi = tmp_path / "cdi"
    checkpoint = Checkpoint(StateLayout(tmp_path / "state"))
    old = Preparer(
        "n1", Claims(named("c", "u-1", 1)), checkpoint, DIRS, view=lambda: VIEW,
        metadata=DeviceMetadata(tmp_path / "plugin", cdi),
    )  # fmt: skip
    await old.prepare(ObjectRef("ns", "c", "u-1"))
    [spec] = list(cdi.glob("*.json"))
    assert "hooks" not in json.loads(spec.read_text())["devices"][0]["containerEdits"]
    spec.unlink()  # the reboot
    new = Preparer(
        "n1", Claims(), Checkpoint(StateLayout(tmp_path / "state")), DIRS, view=lambda: VIEW,
        metadata=DeviceMetadata(tmp_path / "plugin", cdi, gate=argv),
    )  # fmt: skip
    assert new.restore_cdi() == 1
    [spec] = list(cdi.glob("*.json"))
    edits = json.loads(spec.read_text())["devices"][0]["containerEdits"]
    assert edits["hooks"][0]["args"] == argv and edits["mounts"]
