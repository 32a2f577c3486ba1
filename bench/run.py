"""Every benchmark, one at a time, into one JSON file (what `make bench` runs before
`python -m bench.report` renders the README's goals table from it).

    python -m bench.run [--only a,b] [--skip a,b] [--quick] [--out FILE] [--logs DIR]
                        [--timeout-factor F] [--command LABEL] [--list]

Each benchmark runs as its own process (`python -m bench.NAME ... --json`, from the repository's
root), the quick ones first (no test bed), then the test-bed ones in turn: the test bed is a
singleton. Of each: its arguments, its wall time, its exit status and the JSON object of its
last stdout line; a benchmark that fails, prints no JSON or outlives its timeout is recorded as
such with the tail of its stderr, and the run goes on. A timed-out one gets SIGINT (its cleanup
runs: drivers stopped, links deleted, the test bed brought down if it brought it up), then
SIGTERM, then SIGKILL for whatever is left of its session. Optional benchmarks (`optional=True`
below: ones newer than this runner) are skipped when their module is absent.

The file also has the machine (CPU model, cores, memory, kernel, OS, Python, the test bed's
Kubernetes release from testbed/build.sh or $K8S_VERSION), the commit and the UTC date. It is
rewritten after every benchmark, so a run that stops part way leaves what it measured (with
"finished": null). A full run writes docs/performance/bench-latest.json, the file the README is
rendered from; a partial one (--only, --skip, --quick) build/bench-partial.json unless --out
says otherwise. Full stdout and stderr of each benchmark are in --logs (default
build/bench-logs/, not committed).

Exit status: 0 when every benchmark that ran succeeded, 1 otherwise, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]
DEFAULT_OUT = ROOT / "docs" / "performance" / "bench-latest.json"
PARTIAL_OUT = ROOT / "build" / "bench-partial.json"  # a partial run never replaces DEFAULT_OUT
DEFAULT_LOGS = ROOT / "build" / "bench-logs"
SCHEMA = 1
RUN_SOURCE = "bench.run"  # a hand-assembled file says where its figures come from instead
STDERR_TAIL_LINES = 30
STDERR_TAIL_CHARS = 4000
GRACE_S = 90.0  # after SIGINT: a test-bed bench may bring the test bed down


@dataclass(frozen=True)
class Bench:
    """One benchmark as the run invokes it."""

    name: str  # bench/NAME.py, run as `python -m bench.NAME`
    args: tuple[str, ...]  # always with --json
    timeout_s: float
    minutes: float  # about how long it takes on this project's 2-core machine
    needs: str  # "" (the CNI plugins at most), "test bed", or what else
    optional: bool = False  # skipped when bench/NAME.py is absent

    @property
    def quick(self) -> bool:
        return not self.needs

    def argv(self, python: str = sys.executable) -> list[str]:
        return [python, "-m", f"bench.{self.name}", *self.args]

    def present(self, root: Path = ROOT) -> bool:
        return (root / "bench" / f"{self.name}.py").is_file()


# The order of a run: the quick ones, then the ones on the test bed (a singleton) one at a time.
# Arguments are the defaults the README and docs/performance.md cite; minutes are from the
# full run of 2026-11-26 (docs/performance/bench-latest.json has each one's seconds).
BENCHES: tuple[Bench, ...] = (
    Bench("cni_overhead", ("--json",), 900, 1, ""),  # 5 runs of 60 ADD+DEL cycles
    Bench("attach_parallel", ("--json",), 600, 0.5, ""),
    Bench("webhook", ("--json",), 300, 0.1, ""),
    # the cost of judging the largest configs the bounds admit, worst shapes (docs/security.md)
    Bench("judge", ("--timeout", "60", "--json"), 1800, 8, ""),
    Bench("prepare_inproc", ("--json",), 1200, 0.5, "", optional=True),
    Bench("pod_cpu", ("--json",), 900, 1, "", optional=True),
    # the container gate's CPU a container, against the gate before it and a hook doing nothing
    Bench("gate", ("--json",), 300, 0.1, ""),
    # a claim's rate limit against the same traffic unshaped, in namespaces (about 17 s)
    Bench("shaping", ("--json",), 300, 0.3, ""),
    # network policy: 1,000 policies and pods compiled; the largest table and a set update with
    # nft; a change to enforcement through the agent for 20 local pods (about 40 s)
    Bench("netpolicy", ("--nft", "--agent", "--json"), 900, 0.7, ""),
    # 3 rounds of 50 pods five ways; the peers' first build (about 4 min) comes on top
    Bench("pod_ready", ("--json",), 3600, 11, "test bed, peers"),
    # the prepare and memory half (the figures of the goals; pod_ready has the pods)
    Bench("driver_latency", ("--only", "prepare", "--json"), 1800, 1.5, "test bed"),
    Bench("ipam", ("--rounds", "3", "--json"), 2400, 9.5, "test bed, whereabouts"),
    Bench("node_api", ("--json",), 900, 1, "test bed"),
    Bench("claims_scale", ("--json",), 1800, 2, "test bed"),
    # the apiserver client's transports side by side, on an etcd and apiserver of its own from
    # the test bed's build (bench.fleet's ControlPlane), 2 rounds
    Bench("transport", ("--json",), 900, 2, "test bed's build", optional=True),
    # its own etcd, apiserver and scheduler from the test bed's build; its own --timeout 3600
    Bench("fleet", ("--nodes", "1000", "--json"), 4200, 9, "test bed's build", optional=True),
)
BY_NAME = {b.name: b for b in BENCHES}


# ----------------------------------------------------------------------------- the machine


def _first(pattern: str, text: str) -> str | None:
    match = re.search(pattern, text, re.M)
    return match[1].strip() if match else None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def kubernetes_version(root: Path = ROOT, env: dict[str, str] | None = None) -> str | None:
    """The test bed's Kubernetes release: $K8S_VERSION, else testbed/build.sh's default."""
    env = dict(os.environ) if env is None else env
    if env.get("K8S_VERSION"):
        return env["K8S_VERSION"]
    return _first(r'^K8S_VERSION="\$\{K8S_VERSION:-([^}"]+)\}"', _read(root / "testbed/build.sh"))


def machine(root: Path = ROOT) -> dict[str, Any]:
    cpuinfo = _read(Path("/proc/cpuinfo"))
    meminfo = _read(Path("/proc/meminfo"))
    mem_kib = _first(r"^MemTotal:\s+(\d+) kB", meminfo)
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return {
        "cpu": _first(r"^model name\s*:\s*(.+)$", cpuinfo) or platform.processor() or None,
        "cores": usable,
        "memory_gib": round(int(mem_kib) / 2**20, 1) if mem_kib else None,
        "kernel": f"{platform.system()} {platform.release()}",
        "os": _first(r'^PRETTY_NAME="?([^"\n]+)"?', _read(Path("/etc/os-release"))),
        "python": platform.python_version(),
        "kubernetes": kubernetes_version(root),
    }


def commit(root: Path = ROOT) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    head = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": head, "dirty": bool(status) if status is not None else None}


# ----------------------------------------------------------------------------- one benchmark


def _tail(path: Path) -> str:
    lines = _read(path).rstrip().splitlines()[-STDERR_TAIL_LINES:]
    return "\n".join(lines)[-STDERR_TAIL_CHARS:]


def last_json(stdout: str) -> dict[str, Any] | str:
    """The JSON object of the last non-empty stdout line, or why there is none."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return "printed nothing on stdout"
    last = lines[-1].strip()
    try:
        value = json.loads(last)
    except ValueError:
        return f"its last stdout line is not JSON: {last[:120]!r}"
    if not isinstance(value, dict):
        return f"its last stdout line is not a JSON object: {last[:120]!r}"
    return value


def _sigint_default() -> None:
    """In the bench's process before it execs: SIGINT back to its default, so Python makes it
    a KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGINT to the bench (its finally blocks run), SIGTERM, then SIGKILL to its session."""
    for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, min(10.0, grace_s))):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session (start_new_session): what is left
    proc.wait()


def run_one(
    bench: Bench,
    logs: Path,
    timeout_s: float,
    argv: Sequence[str] | None = None,
    grace_s: float = GRACE_S,
    cwd: Path = ROOT,
) -> dict[str, Any]:
    """Run one benchmark; never raises for the benchmark's own failure."""
    argv = list(argv) if argv is not None else bench.argv()
    entry: dict[str, Any] = {
        "module": f"bench.{bench.name}",
        "args": list(bench.args),
        "needs": bench.needs or "no test bed",
        "timeout_s": round(timeout_s),
    }
    out_path, err_path = logs / f"{bench.name}.stdout", logs / f"{bench.name}.stderr"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    interrupted = False
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,  # a terminal's ^C reaches the runner, not the bench
                # a run started in the background (`make bench &`, nohup) has SIGINT ignored,
                # and an ignored SIGINT is inherited: the bench would never see the SIGINT
                # that lets its cleanup run when it times out
                preexec_fn=_sigint_default,  # noqa: PLW1509 - the runner has no threads
            )
        except OSError as e:
            entry.update(status="failed", reason=f"could not start: {e}", exit_code=None)
            entry["seconds"] = 0.0
            return entry
        timed_out = False
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop(proc, grace_s)
        except KeyboardInterrupt:
            interrupted = True
            stop(proc, grace_s)
    entry["seconds"] = round(time.monotonic() - started, 1)
    entry["exit_code"] = proc.returncode
    parsed = last_json(_read(out_path))
    if interrupted:
        entry.update(status="interrupted", reason="the run was interrupted")
    elif timed_out:
        entry.update(status="timeout", reason=f"timed out after {timeout_s:.0f} s")
    elif proc.returncode != 0:
        last = _tail(err_path).splitlines()
        why = last[-1].strip() if last else "no stderr"
        entry.update(status="failed", reason=f"exit {proc.returncode}: {why[:200]}")
    elif isinstance(parsed, str):
        entry.update(status="failed", reason=parsed)
    else:
        entry.update(status="ok", result=parsed)
    if entry["status"] != "ok":
        entry["stderr_tail"] = _tail(err_path)
    if interrupted:
        raise Interrupted(entry)
    return entry


class Interrupted(Exception):
    """The user stopped the run (^C or SIGTERM) while this benchmark ran."""

    def __init__(self, entry: dict[str, Any]) -> None:
        super().__init__("interrupted")
        self.entry = entry


# ----------------------------------------------------------------------------- the run


def select(only: str | None, skip: str | None, quick: bool) -> list[Bench]:
    def names(value: str | None) -> list[str]:
        found = [n.strip() for n in (value or "").split(",") if n.strip()]
        unknown = [n for n in found if n not in BY_NAME]
        if unknown:
            known = ", ".join(BY_NAME)
            raise SystemExit(f"unknown benchmark(s) {', '.join(unknown)}; known: {known}")
        return found

    chosen = names(only) or [b.name for b in BENCHES]
    dropped = set(names(skip))
    return [
        b for b in BENCHES if b.name in chosen and b.name not in dropped and (b.quick or not quick)
    ]


def write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(
    benches: Sequence[Bench],
    out: Path,
    logs: Path,
    command: str,
    timeout_factor: float = 1.0,
    argv_of: Any = None,
    say: Any = None,
) -> dict[str, Any]:
    """Run the benches in order into `out`; `argv_of(bench)` overrides their commands (tests)."""
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    logs.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "source": RUN_SOURCE,
        "command": command,
        "date": now(),
        "finished": None,
        "machine": machine(),
        **commit(),
        "benches": {},
    }
    started = time.monotonic()
    write(out, data)
    total = sum(b.minutes for b in benches)
    say(f"{len(benches)} benchmarks, about {max(total, 1):.0f} min; logs in {logs}")
    for i, bench in enumerate(benches, 1):
        if bench.optional and argv_of is None and not bench.present():
            data["benches"][bench.name] = {
                "module": f"bench.{bench.name}",
                "status": "skipped",
                "reason": f"bench/{bench.name}.py is not in this checkout",
            }
            say(f"[{i}/{len(benches)}] bench.{bench.name}: skipped (not in this checkout)")
            write(out, data)
            continue
        say(
            f"[{i}/{len(benches)}] bench.{bench.name} {' '.join(bench.args)} "
            f"(about {bench.minutes:g} min, {bench.needs or 'no test bed'})"
        )
        argv = argv_of(bench) if argv_of is not None else None
        try:
            entry = run_one(bench, logs, bench.timeout_s * timeout_factor, argv)
        except Interrupted as stopped:
            data["benches"][bench.name] = stopped.entry
            data["interrupted"] = True
            data["seconds"] = round(time.monotonic() - started, 1)
            write(out, data)
            raise
        data["benches"][bench.name] = entry
        say(
            f"    {entry['status']} in {entry['seconds']:.0f} s"
            + (f": {entry['reason']}" if entry["status"] != "ok" else "")
        )
        write(out, data)
    data["finished"] = now()
    data["seconds"] = round(time.monotonic() - started, 1)
    write(out, data)
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", help="comma-separated benchmark names (bench/NAME.py)")
    parser.add_argument("--skip", help="comma-separated benchmark names to leave out")
    parser.add_argument("--quick", action="store_true", help="only the ones without a test bed")
    parser.add_argument(
        "--out",
        type=Path,
        help=f"the JSON file written (default: {DEFAULT_OUT.relative_to(ROOT)} for a full run, "
        f"{PARTIAL_OUT.relative_to(ROOT)} with --only, --skip or --quick)",
    )
    parser.add_argument("--logs", type=Path, default=DEFAULT_LOGS, help="each bench's output")
    parser.add_argument(
        "--timeout-factor", type=float, default=1.0, help="multiplies every benchmark's timeout"
    )
    parser.add_argument("--command", help="how the run was started, for the README's line")
    parser.add_argument("--list", action="store_true", help="print the plan and exit")
    args = parser.parse_args(argv)
    benches = select(args.only, args.skip, args.quick)
    partial = bool(args.only or args.skip or args.quick)
    out = args.out or (PARTIAL_OUT if partial else DEFAULT_OUT)
    if args.list:
        for b in benches:
            print(
                f"{' '.join(b.argv('python'))}  # about {b.minutes:g} min, timeout "
                f"{b.timeout_s * args.timeout_factor:.0f} s, {b.needs or 'no test bed'}"
                + ("" if b.present() else " (not in this checkout: skipped)")
            )
        print(f"# about {sum(b.minutes for b in benches):.0f} min in all")
        return 0
    command = args.command or " ".join(["python -m bench.run", *(argv or sys.argv[1:])])

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        data = run(benches, out, args.logs, command, args.timeout_factor)
    except (Interrupted, KeyboardInterrupt):
        print(f"interrupted; what was measured is in {out}", file=sys.stderr)
        return 130
    failed = [n for n, e in data["benches"].items() if e["status"] not in ("ok", "skipped")]
    print(f"wrote {out}" + (f"; failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
