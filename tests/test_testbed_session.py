"""testbed.cluster.session without a test bed: one run at a time, and a test bed a killed run
left behind is not reused (CI once shared a test bed with a developer's interrupted run: its
helm release and driver were still there, and ten tests failed for it)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testbed import cluster as tb


@dataclass
class Fake:
    calls: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Fake:
    """up, down and `running` replaced: what a session does is the calls it makes."""
    state = Fake()
    monkeypatch.setattr(tb, "KEPT", tmp_path / "kept")
    monkeypatch.setattr(tb, "SESSION_LOCK", tmp_path / "session.lock")
    monkeypatch.setattr(tb, "running", lambda name: 1 if name in state.running else None)
    monkeypatch.setattr(tb.Bins, "locate", staticmethod(lambda: None))

    def up() -> None:
        state.calls.append("up")
        state.running.update(tb.COMPONENTS)

    def down() -> None:
        state.calls.append("down")
        state.running.clear()
        tb.KEPT.unlink(missing_ok=True)

    monkeypatch.setattr(tb, "up", up)
    monkeypatch.setattr(tb, "down", down)
    monkeypatch.delenv("CNIDRA_TESTBED_KEEP", raising=False)
    return state


def test_a_session_brings_it_up_and_down(fake: Fake) -> None:
    with tb.session():
        assert fake.calls == ["up"]
    assert fake.calls == ["up", "down"]


def test_a_kept_test_bed_is_reused_and_left_up(fake: Fake) -> None:
    fake.running.update(tb.COMPONENTS)
    tb.KEPT.touch()
    with tb.session():
        pass
    assert fake.calls == []


def test_keep_leaves_it_up_for_the_next_run_to_reuse(
    fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CNIDRA_TESTBED_KEEP", "1")
    with tb.session():
        pass
    monkeypatch.delenv("CNIDRA_TESTBED_KEEP")
    with tb.session():
        pass
    assert fake.calls == ["up"]


def test_one_a_killed_run_left_running_is_brought_down_first(fake: Fake) -> None:
    fake.running.update(tb.COMPONENTS)  # running, but nobody keeps it
    with tb.session():
        assert fake.calls == ["down", "up"]
    assert fake.calls == ["down", "up", "down"]


def test_half_a_test_bed_is_brought_down_first(fake: Fake) -> None:
    fake.running.add(tb.COMPONENTS[0])
    tb.KEPT.touch()
    with tb.session():
        assert fake.calls == ["down", "up"]


HOLD = """
import time
from pathlib import Path
from testbed import cluster as tb
with tb._exclusive(Path({lock!r}), 1):
    print("held", flush=True)
    time.sleep(30)
"""


def test_a_second_run_waits_for_the_first_and_names_it(tmp_path: Path) -> None:
    lock = tmp_path / "session.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(lock=str(lock))], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        busy = rf"in use by another run \(pid {holder.pid}:"
        with pytest.raises(SystemExit, match=busy), tb._exclusive(lock, 1):
            pass
    finally:
        holder.kill()
        holder.wait()
    with tb._exclusive(lock, 1):  # the holder gone, its lock goes with it
        assert f"pid {os.getpid()}:" in lock.read_text()


def test_drivers_a_killed_run_left_are_found_by_their_nri_socket(tmp_path: Path) -> None:
    """down() kills them: `cnidra driver` processes set up for this test bed, and no other."""
    ours, other = tmp_path / "testbed", tmp_path / "elsewhere"
    sleep = [sys.executable, "-c", "import time; time.sleep(30)", "cnidra", "driver"]
    procs = [
        subprocess.Popen(sleep, env={**os.environ, "CNIDRA_NRI_SOCKET": f"{root}/run/nri.sock"})
        for root in (ours, other)
    ]
    try:
        assert tb.host_drivers(ours) == [procs[0].pid]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
