"""A soak: pods with cnidra interfaces created and deleted in waves through the real kubelet and
containerd on the test bed, the driver (shipped defaults) restarted a few times along the way,
its RSS, descriptors, threads and asyncio tasks sampled, and everything it could leak counted
at the end (not a test: numbers; `make soak`).

    python -m bench.soak [--cycles 10000] [--wave 20] [--restarts 3] [--json]

A cycle is one pod: created with a ResourceClaimTemplate (macvlan on a test-made bridge, an
address from a cnidra IPAM pool), Ready with its interface, deleted, gone. The last line of the
output is one JSON object: {"cycles", "seconds", "rss_mib": {"start", "end", "max"},
"rss_slope_mib_per_1000", "fds": {"start", "end", "added", "gone"}, "threads": {"start", "end"},
"tasks": {"start", "end"}, "leaks": {"netns", "links", "files", "leases", "finalizers",
"records", "cdi_specs", "metrics_series"}}. The slope is the least-squares fit of RSS against
cycles within each stretch between restarts (a restart starts RSS afresh) after its first 100
cycles (warm-up), averaged over the stretches weighted by their cycles. Every sample is taken at
rest: after each wave the soak waits until the deleted pods' teardown is done on the node (their
network namespaces, records, CDI specs and leases gone; "unsettled_waves" counts the waves where
that took over 120 s). "start" is sampled after the first wave, "end" 35 s after the last (the
status writer's removals are due 30 s after a claim goes). Leaks are counted against the state
after the first wave (what is made once: the pool's block, caches); the metrics series against
the first wave after the last restart: "metrics_series" counts the added series that name a pod,
claim or sandbox (all gone by then), "new_series" lists the other added ones (a label value of a
bounded set seen for the first time, such as a response code), without histogram buckets. The
descriptors "added" and "gone" between start and end are named (a path, a pipe, a socket by
family and peer) when there are any. A SIGTERM (a `timeout` around it) ends the waves early: the
pods are deleted, the leaks counted and the JSON printed as ever, with "interrupted": true.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench.pools import delete_pool, in_namespace
from cnidra.state.layout import DEFAULT_STATE_ROOT
from cnidra.state.store import read_records
from testbed import cluster as tb
from testbed.harness import Cluster, DriverProcess

DRIVER = "cni.dra.networking.x-k8s.io"
POOL_RANGE = "198.18.176.0/22"
CDI_DIR = tb.NODE1.cdi  # where the test bed's containerd reads CDI specs (the node's /var/run/cdi)
WARMUP = 100  # cycles after each (re)start left out of the RSS slope


def objects(namespace: str, parent: str) -> list[dict[str, Any]]:
    config = {
        "cniVersion": "1.0.0",
        "name": "soak",
        "plugins": [
            {
                "type": "macvlan",
                "mode": "bridge",
                "ipam": {"type": "cnidra", "pool": f"soak-{namespace}"},
            }
        ],
    }
    selector = f'device.attributes["{DRIVER}"].ifName == "{parent}"'
    params = {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIConfig",
        "config": config,
    }
    return [
        {
            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
            "kind": "CNIIPPool",
            "metadata": {"name": f"soak-{namespace}"},
            "spec": {"ranges": [{"subnet": POOL_RANGE}], "namespaces": [namespace]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "soak"},
            "spec": {"spec": {"devices": {
                "requests": [{"name": "net", "exactly": {
                    "deviceClassName": "cni.networking.x-k8s.io",
                    "selectors": [{"cel": {"expression": selector}}]}}],
                "config": [{"requests": ["net"],
                            "opaque": {"driver": DRIVER, "parameters": params}}],
            }}},
        },
    ]  # fmt: skip


def policy_samples() -> list[dict[str, Any]]:
    """What the run sends, for tests/bench's check against the shipped policy."""
    return in_namespace("soak-ns", *objects("soak-ns", "soak0"), pod("p0"))


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"soak": "1"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "net", "resourceClaimTemplateName": "soak"}],
            "containers": [
                {
                    "name": "c",
                    "image": tb.TEST_IMAGE,
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "net"}]},
                }
            ],
        },
    }


def sample(driver: DriverProcess) -> dict[str, float]:
    """RSS, threads, descriptors and asyncio tasks. The descriptors leave out the soak's own
    probes: its /healthz and /metrics requests are answered on connections the driver accepts,
    which can still be closing when the count is read (a 24th descriptor, now and then)."""
    pid = driver.pid
    tasks = float(driver.health().get("asyncioTasks") or 0)
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "threads": int(fields["Threads"]),
        "fds": sum(1 for d in descriptors(pid, driver.port) if d != PROBE),
        "tasks": tasks,
    }


PROBE = "tcp: a probe of the soak's, accepted on the driver's HTTP port"


def descriptors(pid: int, http_port: int | None = None) -> list[str]:
    """What each of the process's descriptors is: a file's path, a pipe, an anon inode (eventfd,
    epoll), or a socket by family with its peer (a TCP connection's remote port, a unix
    socket's path), so a descriptor added over the soak can be named; a connection accepted on
    `http_port` (the driver's /healthz and /metrics) is PROBE."""
    sockets: dict[str, str] = {}
    for family in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{family}").read_text().splitlines()[1:]:
            f = line.split()
            local, remote, state = (int(f[i].rsplit(":", 1)[-1], 16) for i in (1, 2, 3))
            listening = state == 10  # TCP_LISTEN
            sockets[f[9]] = (
                PROBE
                if local == http_port and not listening
                else f"{family} -> :{remote} state {state}"
            )
    for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        f = line.split()
        sockets[f[6]] = f"unix {f[7] if len(f) > 7 else '(unnamed)'}"
    for line in Path(f"/proc/{pid}/net/netlink").read_text().splitlines()[1:]:
        f = line.split()
        sockets[f[-1]] = f"netlink protocol {f[1]}"
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            target = sockets.get(target[8:-1], "socket (other)")
        elif target.startswith("pipe:["):
            target = "pipe"
        out.append(target)
    return sorted(out)


def difference(start: list[str], end: list[str]) -> dict[str, list[str]]:
    """The descriptors added and gone between two readings, as multisets."""
    a, b = Counter(start), Counter(end)
    return {"added": sorted((b - a).elements()), "gone": sorted((a - b).elements())}


def slope(points: list[tuple[float, float]]) -> float:
    """Least squares: RSS MiB per cycle."""
    n = len(points)
    if n < 3:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


def counts(bed: Cluster, driver: DriverProcess, namespace: str) -> dict[str, int]:
    """Everything a pod's life could leave behind, counted now."""
    state = driver.state_root
    run_netns = tb.NODE1.netns_dir  # where containerd mounts the pods' network namespaces
    links = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True)
    claims = json.loads(bed.kubectl("get", "resourceclaims", "-n", namespace, "-o", "json").stdout)[
        "items"
    ]
    series = metric_series(driver)
    return {
        "netns": len(list(run_netns.glob("*"))) if run_netns.exists() else 0,
        "links": len(json.loads(links.stdout)),
        "files": sum(1 for p in state.rglob("*") if p.is_file()),
        "leases": len(read_records(state / "pools" / "addresses")),
        "finalizers": sum(1 for c in claims if c["metadata"].get("finalizers")),
        "records": len(read_records(state / "claims"))
        + len(list((state / "sandboxes").glob("*.json"))),
        "cdi_specs": len(list(CDI_DIR.glob(f"{DRIVER}_*"))) if CDI_DIR.exists() else 0,
        "metrics_series": len(series),
    }


# labels of series about one pod's interface, which must go when the pod goes; the others have
# bounded label sets (a method, an outcome, a response code, a network's name)
PER_OBJECT_LABELS = ("pod=", "claim=", "sandbox=")


def metric_series(driver: DriverProcess) -> set[str]:
    """The driver's series now, each by name and labels (its value left out)."""
    lines = driver.metrics().splitlines()
    return {line.rsplit(" ", 1)[0] for line in lines if line and line[0] != "#"}


def new_series(base: set[str], now: set[str]) -> tuple[int, list[str]]:
    """Series added since `base`: how many name a pod, claim or sandbox (leaks: the pods are all
    gone), and the rest by metric name and labels (a first 409, a first failure's reason:
    bounded, shown for the reader to judge), without histogram buckets."""
    added = now - base
    leaks = sum(1 for s in added if any(label in s for label in PER_OBJECT_LABELS))
    shown = sorted(
        s
        for s in added
        if not any(label in s for label in PER_OBJECT_LABELS)
        and not s.split("{")[0].endswith(("_bucket", "_created"))
    )
    return leaks, shown


# what a pod's life makes on the node and takes away again once its teardown is done: each is
# back to its value before the first pod when the node is at rest
AT_REST = ("netns", "records", "cdi_specs", "leases")


def settle(
    bed: Cluster, driver: DriverProcess, namespace: str, rest: dict[str, int], timeout: float = 120
) -> bool:
    """Wait (at most `timeout` s) until the deleted pods' teardown is done on the node: their
    namespaces, records, CDI specs and leases gone, as before the first pod. The API forgets a
    pod (grace 0) before containerd and the driver have torn its sandbox down, so counting or
    sampling right after `wait_gone` measures a teardown in flight. False if it never was."""
    deadline = time.monotonic() + timeout
    while True:
        now = counts(bed, driver, namespace)
        if all(now[k] <= rest[k] for k in AT_REST):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(1)


def wait_ready(bed: Cluster, namespace: str, count: int, timeout: float = 300) -> None:
    def ready() -> bool:
        out = bed.kubectl("get", "pods", "-n", namespace, "-l", "soak=1", "-o", "json")
        items = json.loads(out.stdout)["items"]
        up = [
            p for p in items
            if any(c["type"] == "Ready" and c["status"] == "True"
                   for c in p.get("status", {}).get("conditions", []))
        ]  # fmt: skip
        return len(up) == count

    bed.wait(f"{count} soak pods Ready", ready, timeout)


def wait_gone(bed: Cluster, namespace: str, timeout: float = 300) -> None:
    bed.wait(
        "the soak pods and their claims gone",
        lambda: (
            not json.loads(
                bed.kubectl("get", "pods,resourceclaims", "-n", namespace, "-o", "json").stdout
            )["items"]
        ),
        timeout,
    )


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # a SIGTERM (timeout, kill) cleans up as Ctrl-C does


def main() -> None:  # noqa: PLR0915 - one linear script of measurements
    signal.signal(signal.SIGTERM, _interrupted)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=10000)
    parser.add_argument("--wave", type=int, default=20)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    parser.add_argument("--log", type=Path, help="keep the driver's log (all its runs) here")
    args = parser.parse_args()
    if args.log and not args.log.parent.is_dir():
        parser.error(f"--log {args.log}: {args.log.parent} is not a directory")
    if args.cycles < 1 or args.wave < 1 or args.restarts < 0:
        parser.error("--cycles and --wave must be at least 1, --restarts at least 0")
    say = (lambda *a: None) if args.json else print
    parent = f"sk{uuid.uuid4().hex[:4]}"
    namespace = f"soak-{uuid.uuid4().hex[:6]}"
    waves = max(1, args.cycles // args.wave)
    restart_at = {waves * (i + 1) // (args.restarts + 1) for i in range(args.restarts)}
    with tb.session() as bins, tempfile.TemporaryDirectory() as tmp:
        bed = Cluster(bins, tb.env_dict())
        bed.install_cnidra_api()
        subprocess.run(["ip", "link", "add", parent, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", parent, "up"], check=True)
        driver = DriverProcess(bed, Path(tmp), defaults=True)  # as the chart runs it
        try:
            driver.start()
            bed.wait("cnidra's NRI plugin", lambda: driver.health().get("nriConnected"), 60)
            bed.kubectl("create", "namespace", namespace)
            bed.kubectl(
                "label", "namespace", namespace, "cni.networking.x-k8s.io/claim-config=true"
            )
            bed.wait(
                "the namespace's ServiceAccount",
                lambda: bed.kubectl(
                    "get", "serviceaccount", "default", "-n", namespace, check=False
                ).returncode == 0,
                60,
            )  # fmt: skip
            bed.apply_in(namespace, *objects(namespace, parent))
            rest = counts(bed, driver, namespace)  # the node before the first pod
            unsettled = 0
            before: dict[str, int] = {}
            series_base: set[str] = set()
            started = time.monotonic()
            cycles = 0
            stretches: list[list[tuple[float, float]]] = [[]]
            first: dict[str, float] | None = None
            fds_first: list[str] = []
            rss_max = 0.0
            last: dict[str, float] = {}
            interrupted = False
            try:
                for wave in range(waves):
                    names = [f"p{wave}-{i}" for i in range(args.wave)]
                    bed.apply_in(namespace, *(pod(n) for n in names))
                    wait_ready(bed, namespace, len(names))
                    bed.kubectl("delete", "pods", "-n", namespace, "-l", "soak=1", "--wait=false")
                    wait_gone(bed, namespace)
                    unsettled += not settle(bed, driver, namespace, rest)
                    cycles += len(names)
                    last = sample(driver)
                    if not before:  # after the first wave: files and series that are made once
                        before = counts(bed, driver, namespace)
                    if not series_base:  # after the first wave since the (re)start
                        series_base = metric_series(driver)
                    if first is None:
                        fds_first = descriptors(driver.pid, driver.port)
                    first = first or last
                    rss_max = max(rss_max, last["rss_mib"])
                    stretches[-1].append((cycles, last["rss_mib"]))
                    say(f"{cycles} cycles, {time.monotonic() - started:.0f}s: {last}")
                    if not args.json and last["fds"] != first["fds"]:
                        now = descriptors(driver.pid, driver.port)
                        say(f"  descriptors: {difference(fds_first, now)}")
                    if wave + 1 in restart_at:
                        driver.stop()
                        driver.start()
                        bed.wait("NRI again", lambda: driver.health().get("nriConnected"), 60)
                        stretches.append([])
                        series_base = set()
            except KeyboardInterrupt:  # a SIGTERM (a timeout): what was measured is still said
                interrupted = True
                bed.kubectl("delete", "pods", "-n", namespace, "-l", "soak=1", "--wait=false",
                            check=False)  # fmt: skip
                wait_gone(bed, namespace)
            seconds = time.monotonic() - started
            unsettled += not settle(bed, driver, namespace, rest)
            # the status writer's removals (DROP_GRACE, 30 s) and the sweeper settle: the end's
            # descriptors, threads and tasks are sampled at rest, as the start's (after the
            # first wave's teardown) were
            time.sleep(35)
            after = counts(bed, driver, namespace)
            series_leaks, series_added = new_series(series_base, metric_series(driver))
            last = sample(driver)
            fds_end = descriptors(driver.pid, driver.port)
            # each stretch without its warm-up (the first WARMUP cycles after a (re)start fill
            # caches, import lazily and grow the heap once)
            warm = [[p for p in s if p[0] - s[0][0] >= WARMUP] for s in stretches if s]
            weighted = [(slope(s), s[-1][0] - s[0][0]) for s in warm if len(s) >= 3]
            total = sum(w for _, w in weighted) or 1
            assert first is not None
            result = {
                "cycles": cycles,
                **({"interrupted": True} if interrupted else {}),
                "seconds": round(seconds, 1),
                "rss_mib": {"start": round(first["rss_mib"], 1), "end": round(last["rss_mib"], 1),
                            "max": round(rss_max, 1)},
                "rss_slope_mib_per_1000": round(sum(s * w for s, w in weighted) / total * 1000, 3),
                "fds": {"start": int(first["fds"]), "end": int(last["fds"]),
                        **({k: v for k, v in difference(fds_first, fds_end).items() if v})},
                "threads": {"start": int(first["threads"]), "end": int(last["threads"])},
                "tasks": {"start": int(first["tasks"]), "end": int(last["tasks"])},
                "unsettled_waves": unsettled,
                "leaks": {
                    **{k: after[k] - before[k] for k in before},
                    "metrics_series": series_leaks,
                },
                "new_series": series_added,
            }  # fmt: skip
            print(json.dumps(result))
        finally:
            bed.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s",
                        check=False, timeout=240)  # fmt: skip
            delete_pool(bed, f"soak-{namespace}")  # with the node's blocks in it
            driver.stop()
            if args.log:
                shutil.copyfile(driver.log, args.log)
            shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)
            subprocess.run(["ip", "link", "del", parent], check=False, capture_output=True)


if __name__ == "__main__":
    main()
