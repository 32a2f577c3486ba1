"""hack/run-tests.py, make test's runner of its two halves: a unit failure stops the test bed's
half with SIGINT (so its fixtures clean up) even when the runner was started with SIGINT
ignored (nohup, `make test &`), and the exit status says which half failed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT

# a stand-in for pytest: `unit` exits with the status given once the test bed's half is
# running (its file `.ready` made: a unit half that ended before the other got to Python's
# `try` interrupted the interpreter's start, not the half, on a slow machine); `testbed`
# writes "interrupted" to its file on KeyboardInterrupt (as pytest's teardown would run),
# else sleeps and exits 0
FAKE = """
import os, sys, time
half, arg = sys.argv[1], sys.argv[2]
if half == "unit":
    deadline = time.monotonic() + 60
    while not os.path.exists(os.environ["FAKE_READY"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(int(arg))
try:
    open(os.environ["FAKE_READY"], "w").close()
    time.sleep(float(sys.argv[3]))
except KeyboardInterrupt:
    open(arg, "w").write("interrupted")
    sys.exit(2)
"""


def run(tmp_path: Path, unit_rc: int, testbed_seconds: float) -> tuple[int, str, float]:
    fake = tmp_path / "fake-pytest"
    fake.write_text(f"#!{sys.executable}\n{FAKE}")
    fake.chmod(0o755)
    marker = tmp_path / "testbed"
    started = time.monotonic()
    ran = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "run-tests.py"), str(fake),
         "--unit", "unit", str(unit_rc), "--testbed", "testbed", str(marker),
         str(testbed_seconds)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "FAKE_READY": str(tmp_path / "testbed.ready")},
        # as under nohup: the halves must not inherit the ignored SIGINT
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    took = time.monotonic() - started
    return ran.returncode, marker.read_text() if marker.exists() else "", took


def test_a_unit_failure_interrupts_the_test_beds_half(tmp_path: Path) -> None:
    rc, testbed, took = run(tmp_path, 1, 30)
    assert rc == 1
    assert testbed == "interrupted"
    assert took < 20  # not the test bed's 30 s


def test_both_halves_pass_and_the_test_beds_status_is_the_runs(tmp_path: Path) -> None:
    rc, testbed, _ = run(tmp_path, 0, 0.5)
    assert (rc, testbed) == (0, "")
