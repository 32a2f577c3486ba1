"""ADD+DEL cycles of one conflist (bridge + host-local + tuning), three ways in one run:

  raw      each plugin binary exec'd directly with precomputed stdin: the physical floor
  cnitool  libcni's reference CLI, one process per ADD and per DEL
  cnidra   cnidra's async runtime, as the driver uses it (in process)

The three alternate round by round so that machine noise hits them alike. Everything runs in a
throwaway node namespace, and in a private mount namespace whose /var/lib is a tmpfs (cnitool
always caches under /var/lib/cni), so the host is untouched.

    python -m bench.cni_overhead [--cycles N] [--runs N] [--json]

With --runs N (default 5) the whole measurement runs N times; the result is each run's medians
and the median of the runs' cnidra/raw ratios, the figure the goal (at most 1.05) is about.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cnidra.cni import CNIRuntime, NetworkConfigList, RuntimeConf, netns

ROOT = Path(__file__).parents[1]
NETWORK = "bench"


def conflist(data_dir: str) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "bench-br0",
                "isGateway": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": data_dir,
                    "ranges": [[{"subnet": "198.18.64.0/24"}]],
                },
            },
            {"type": "tuning", "sysctl": {"net.ipv4.conf.net1.arp_notify": "1"}},
        ],
    }


def tool_paths() -> dict[str, str]:
    subprocess.run([ROOT / "hack" / "install-cni.sh"], check=True)
    out = subprocess.run(
        [ROOT / "hack" / "install-cni.sh", "env"], check=True, text=True, capture_output=True
    ).stdout
    return dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines())


class Raw:
    """Precomputed stdin per plugin and command; exec the binaries in sequence."""

    def __init__(self, plugins_dir: str, config: dict[str, Any], pod: str) -> None:
        self.dir = plugins_dir
        self.pod = pod
        self.env_base = {
            "PATH": os.environ.get("PATH", ""),
            "CNI_PATH": plugins_dir,
            "CNI_CONTAINERID": "raw",
            "CNI_NETNS": pod,
            "CNI_IFNAME": "net1",
            "CNI_ARGS": "",
        }
        self.config = config
        self.add_stdin: list[tuple[str, bytes]] = []
        self.del_stdin: list[tuple[str, bytes]] = []

    def prepare(self) -> None:
        """One real ADD to learn the prevResult each later plugin gets; then DEL."""
        prev: Any = None
        final: Any = None
        for plugin in self.config["plugins"]:
            conf = {**plugin, "name": NETWORK, "cniVersion": self.config["cniVersion"]}
            if prev is not None:
                conf["prevResult"] = prev
            stdin = json.dumps(conf).encode()
            self.add_stdin.append((plugin["type"], stdin))
            prev = final = json.loads(self._exec(plugin["type"], "ADD", stdin))
        for plugin in reversed(self.config["plugins"]):
            conf = {
                **plugin,
                "name": NETWORK,
                "cniVersion": self.config["cniVersion"],
                "prevResult": final,
            }
            self.del_stdin.append((plugin["type"], json.dumps(conf).encode()))
        self.delete()

    def _exec(self, plugin: str, command: str, stdin: bytes) -> bytes:
        proc = subprocess.run(
            [os.path.join(self.dir, plugin)],
            input=stdin,
            capture_output=True,
            env={**self.env_base, "CNI_COMMAND": command},
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"raw {plugin} {command}: {proc.stdout!r} {proc.stderr!r}")
        return proc.stdout

    def add(self) -> None:
        for plugin, stdin in self.add_stdin:
            self._exec(plugin, "ADD", stdin)

    def delete(self) -> None:
        for plugin, stdin in self.del_stdin:
            self._exec(plugin, "DEL", stdin)


class Cnitool:
    def __init__(
        self, cnitool: str, plugins_dir: str, config: dict[str, Any], pod: str, confdir: Path
    ) -> None:
        (confdir / f"{NETWORK}.conflist").write_text(json.dumps(config))
        self.cmd = cnitool
        self.pod = pod
        self.env = {
            **os.environ,
            "NETCONFPATH": str(confdir),
            "CNI_PATH": plugins_dir,
            "CNI_IFNAME": "net1",
        }

    def _run(self, command: str) -> None:
        proc = subprocess.run(
            [self.cmd, command, NETWORK, self.pod], env=self.env, capture_output=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"cnitool {command}: {proc.stderr!r}")

    def add(self) -> None:
        self._run("add")

    def delete(self) -> None:
        self._run("del")


async def measure(paths: dict[str, str], cycles: int, warmup: int) -> dict[str, Any]:
    plugins, cnitool_bin = paths["CNIDRA_TEST_CNI_PATH"], paths["CNIDRA_TEST_CNITOOL"]
    scratch = Path(tempfile.mkdtemp(prefix="cnidra-bench-"))
    with (
        netns.temporary("cnidra-bench-node") as node,
        netns.entered(node),
        netns.temporary("cnidra-bench-pod") as pod,
    ):
        config = conflist(str(scratch / "ipam"))
        raw = Raw(plugins, config, str(pod))
        raw.prepare()
        tool = Cnitool(cnitool_bin, plugins, config, str(pod), scratch)
        runtime = CNIRuntime([plugins], cache_dir=str(scratch / "cache"), timeout=30)
        net = NetworkConfigList.from_dict(config)
        rt = RuntimeConf("cnidra", str(pod), "net1")

        async def cnidra_cycle() -> None:
            await runtime.add(net, rt)
            await runtime.delete(net, rt)

        def sync_cycle(impl: Raw | Cnitool) -> None:
            impl.add()
            impl.delete()

        times: dict[str, list[float]] = {"raw": [], "cnitool": [], "cnidra": []}
        for i in range(warmup + cycles):
            for name in ("raw", "cnitool", "cnidra"):
                start = time.perf_counter()
                if name == "cnidra":
                    await cnidra_cycle()
                else:
                    sync_cycle(raw if name == "raw" else tool)
                elapsed = (time.perf_counter() - start) * 1000
                if i >= warmup:
                    times[name].append(elapsed)
    shutil.rmtree(scratch, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    p90 = {k: statistics.quantiles(v, n=10)[-1] for k, v in times.items()}
    return {
        "conflist": "bridge + host-local + tuning",
        "cycles": cycles,
        "raw_ms": round(med["raw"], 2),
        "cnitool_ms": round(med["cnitool"], 2),
        "cnidra_ms": round(med["cnidra"], 2),
        "raw_p90_ms": round(p90["raw"], 2),
        "cnitool_p90_ms": round(p90["cnitool"], 2),
        "cnidra_p90_ms": round(p90["cnidra"], 2),
        "ratio_vs_raw": round(med["cnidra"] / med["raw"], 3),
        "ratio_vs_cnitool": round(med["cnidra"] / med["cnitool"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.inner:
        # private mount namespace with a tmpfs /var/lib, so cnitool's /var/lib/cni is ours
        script = (
            "mount -t tmpfs cnidra-bench /var/lib && mkdir -p /var/lib/cni && "
            f'exec "{sys.executable}" -m bench.cni_overhead --inner '
            f"--cycles {args.cycles} --warmup {args.warmup} --runs {args.runs}"
            + (" --json" if args.json else "")
        )
        raise SystemExit(
            subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                cwd=ROOT,
                check=False,
            ).returncode
        )
    runs = [asyncio.run(measure(tool_paths(), args.cycles, args.warmup)) for _ in range(args.runs)]
    result: dict[str, Any] = {
        "conflist": runs[0]["conflist"],
        "cycles": args.cycles,
        "runs": [{k: v for k, v in r.items() if k not in ("conflist", "cycles")} for r in runs],
        "median_ratio_vs_raw": round(statistics.median(r["ratio_vs_raw"] for r in runs), 3),
        "median_ratio_vs_cnitool": round(statistics.median(r["ratio_vs_cnitool"] for r in runs), 3),
    }
    if not args.json:
        print(
            f"{args.runs} runs of {args.cycles} ADD+DEL cycles of {result['conflist']} "
            "(median per cycle):",
            file=sys.stderr,
        )
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
