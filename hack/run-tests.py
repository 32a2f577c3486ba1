#!/usr/bin/env python3
"""`make test`'s two halves at once: the unit half (pytest-xdist, below normal CPU priority,
its output kept in a file and printed when it ends) beside the test bed's half (its output as
it comes). The test bed's first minutes are mostly waits (its components starting, pods
scheduled, the image building), which the unit half fills: measured on this project's 2-core
machine, the two in sequence took the unit half's whole time more than the test bed alone
(README, "Tests").

A unit failure stops the run: the test bed's pytest gets SIGINT, so its fixtures still tear
down what they made, and the unit half's output is printed. SIGINT or SIGTERM to this script
reach both halves the same way. The exit status is the unit half's when it failed, else the
test bed's.

    run-tests.py PYTEST --unit ARG... --testbed ARG...

Standard library only (it runs before anything else is known to work)."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from types import FrameType

UNIT_NICENESS = 10  # the test bed's processes (apiserver, kubelet, the driver) come first


def split(argv: list[str]) -> tuple[str, list[str], list[str]]:
    if len(argv) < 4 or argv[1] != "--unit" or "--testbed" not in argv:
        raise SystemExit("usage: run-tests.py PYTEST --unit ARG... --testbed ARG...")
    at = argv.index("--testbed")
    return argv[0], argv[2:at], argv[at + 1 :]


def main() -> int:
    pytest, unit_args, testbed_args = split(sys.argv[1:])
    started = time.monotonic()
    with tempfile.TemporaryFile("w+", prefix="cnidra-unit-") as unit_log:
        procs: list[subprocess.Popen[bytes]] = []

        def forward(signum: int, _frame: FrameType | None) -> None:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)

        # handled here before the halves start, so they start with SIGINT's default action
        # (an ignored signal stays ignored across exec: under nohup or `make ... &` pytest
        # would then ignore the SIGINT that lets its fixtures clean up)
        signal.signal(signal.SIGINT, forward)
        signal.signal(signal.SIGTERM, forward)
        unit = subprocess.Popen(
            ["nice", "-n", str(UNIT_NICENESS), pytest, *unit_args],
            stdout=unit_log,
            stderr=subprocess.STDOUT,
        )
        procs.append(unit)
        testbed = subprocess.Popen([pytest, *testbed_args])
        procs.append(testbed)

        unit_rc = unit.wait()
        unit_log.seek(0)
        took = time.monotonic() - started
        print(f"\n== the unit half ({' '.join(unit_args)}), {took:.0f} s ==", flush=True)
        sys.stdout.write(unit_log.read())
        if unit_rc != 0:
            print("== the unit half failed: stopping the test bed's half ==\n", flush=True)
            if testbed.poll() is None:
                testbed.send_signal(signal.SIGINT)
            testbed.wait()
            return unit_rc
        print("== end of the unit half; the test bed's half goes on ==\n", flush=True)
        return testbed.wait()


if __name__ == "__main__":
    sys.exit(main())
