"""docs/dashboard.png: the shipped Grafana dashboard's panels, drawn from the test bed's data
(not a test; a picture for the docs).

    python -m bench.dashboard_picture [--minutes 6] [--out docs/dashboard.png]

The driver runs on the test bed with its defaults; a real Prometheus (hack/install-prometheus.sh,
built from the Go module proxy) scrapes its /metrics every 5 s while pods come and go in waves
through the real kubelet and containerd: pods on a macvlan network with cnidra IPAM that ping
each other over it, and one pod whose network fails at ADD (to fill the failure panel; its
address is the pool's too: a tenant's static address outside every CNIIPPool is refused at
prepare, before any ADD, docs/ipam.md). Then
every panel's own queries (charts/cnidra/dashboards/cnidra.json, `$node` = all,
`$__rate_interval` = 30s) are asked of Prometheus over the run and drawn in the dashboard's
layout with matplotlib (Grafana itself, a Node.js build, is not built here: the queries and the
data are the real ones, the drawing is ours). About --minutes plus 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench.pools import delete_pool, in_namespace
from testbed import cluster as tb
from testbed.harness import ROOT, Cluster, DriverProcess

BOARD = ROOT / "charts" / "cnidra" / "dashboards" / "cnidra.json"
DRIVER = "cni.dra.networking.x-k8s.io"
POOL_RANGE = "198.18.170.0/24"


def prometheus_binary() -> str:
    out = subprocess.run(
        [ROOT / "hack" / "install-prometheus.sh"], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def objects(namespace: str, parent: str) -> list[dict[str, Any]]:
    def template(name: str, plugin: dict[str, Any]) -> dict[str, Any]:
        config = {"cniVersion": "1.0.0", "name": name, "plugins": [plugin]}
        params = {
            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
            "kind": "CNIConfig",
            "config": config,
        }
        selector = f'device.attributes["{DRIVER}"].ifName == "{parent}"'
        request = {
            "name": "net",
            "exactly": {
                "deviceClassName": "cni.networking.x-k8s.io",
                "selectors": [{"cel": {"expression": selector}}],
            },
        }
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [request],
                        "config": [
                            {
                                "requests": ["net"],
                                "opaque": {"driver": DRIVER, "parameters": params},
                            }
                        ],
                    }
                }
            },
        }

    ipam = {"type": "cnidra", "pool": f"dash-{namespace}"}
    return [
        {
            "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
            "kind": "CNIIPPool",
            "metadata": {"name": f"dash-{namespace}"},
            "spec": {"ranges": [{"subnet": POOL_RANGE}], "namespaces": [namespace]},
        },
        template(
            "storage",
            {"type": "macvlan", "mode": "bridge", "ipam": ipam},
        ),
        # fails at ADD: an MTU above its parent's
        template("broken", {"type": "macvlan", "mode": "bridge", "mtu": 65000, "ipam": ipam}),
    ]  # fmt: skip


def policy_samples() -> list[dict[str, Any]]:
    """What the run sends, for tests/bench's check against the shipped policy."""
    return in_namespace(
        "dash-ns",
        *objects("dash-ns", "dsh0"),
        pod("broken-0", "broken", talk=False),
        pod("w0-0", "storage", talk=True),
    )


def pod(name: str, template: str, talk: bool) -> dict[str, Any]:
    # ping every address the pool hands out first, with big packets: traffic on net1
    script = (
        "while true; do for i in 1 2 3 4 5 6 7 8 9 10; do "
        "ping -c 2 -s 1200 -W 1 198.18.170.$i >/dev/null 2>&1; done; sleep 1; done"
        if talk
        else "sleep 3600"
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"dash": "1"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "net", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "c",
                    "image": tb.TEST_IMAGE,
                    "command": ["sh", "-c", script],
                    "resources": {"claims": [{"name": "net"}]},
                }
            ],
        },
    }


def query_range(port: int, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "10"})
    with urllib.request.urlopen(
        f"http://127.0.0.1:{port}/api/v1/query_range?{params}", timeout=30
    ) as r:
        body = json.load(r)
    return list(body["data"]["result"])


def legend(fmt: str, labels: dict[str, str]) -> str:
    out = fmt
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def draw(board: dict[str, Any], port: int, start: float, end: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = board["panels"]
    rows = max(p["gridPos"]["y"] for p in panels) // 8 + 1
    fig = plt.figure(figsize=(24, 4.2 * rows), facecolor="#111217")
    fig.suptitle(board["title"] + " (test bed, real Prometheus, the dashboard's queries)",
                 color="#d8d9da", fontsize=16, x=0.01, ha="left")  # fmt: skip
    grid = fig.add_gridspec(rows, 24, hspace=0.55, wspace=1.2)
    for panel in panels:
        pos = panel["gridPos"]
        ax = fig.add_subplot(grid[pos["y"] // 8, pos["x"] : pos["x"] + pos["w"]])
        ax.set_facecolor("#181b1f")
        ax.set_title(panel["title"], color="#d8d9da", fontsize=11, loc="left")
        ax.tick_params(colors="#8e8e8e", labelsize=8)
        for side in ax.spines.values():
            side.set_color("#2c3235")
        ax.grid(color="#2c3235", linewidth=0.5)
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        drawn = 0
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "30s").replace('"$node"', '".*"')
            for series in query_range(port, expr, start, end)[:10]:
                xs = [(float(t) - start) / 60 for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                if unit == "percentunit":
                    ys = [y * 100 for y in ys]
                ax.plot(
                    xs, ys, linewidth=1.4, label=legend(target["legendFormat"], series["metric"])
                )
                drawn += 1
        ax.set_xlabel("minutes", color="#8e8e8e", fontsize=8)
        ax.set_ylabel({"percentunit": "%", "Bps": "bytes/s", "pps": "packets/s", "s": "seconds",
                       "ops": "per second"}.get(unit, ""), color="#8e8e8e", fontsize=8)  # fmt: skip
        if drawn:
            ax.legend(fontsize=7, facecolor="#181b1f", labelcolor="#d8d9da", edgecolor="#2c3235",
                      loc="upper left")  # fmt: skip
        else:
            ax.text(0.5, 0.5, "no data", color="#8e8e8e", ha="center", transform=ax.transAxes)
    fig.savefig(out, dpi=70, facecolor=fig.get_facecolor(), bbox_inches="tight")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=6)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = parser.parse_args()
    board = json.loads(BOARD.read_text())
    prometheus = prometheus_binary()
    parent = f"dsh{uuid.uuid4().hex[:4]}"
    namespace = f"dash-{uuid.uuid4().hex[:6]}"
    with tb.session() as bins, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bed = Cluster(bins, tb.env_dict())
        bed.install_cnidra_api()
        subprocess.run(["ip", "link", "add", parent, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", parent, "up"], check=True)
        (work / "driver").mkdir()
        driver = DriverProcess(bed, work / "driver")
        prom: subprocess.Popen[bytes] | None = None
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
            port = tb_free_port()
            (work / "prometheus.yml").write_text(json.dumps({
                "global": {"scrape_interval": "5s"},
                "scrape_configs": [{"job_name": "cnidra", "static_configs": [{
                    "targets": [f"{driver.host}:{driver.port}"], "labels": {"node": "node1"}}]}],
            }))  # fmt: skip
            prom = subprocess.Popen(
                [prometheus, f"--config.file={work / 'prometheus.yml'}",
                 f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                stdout=subprocess.DEVNULL, stderr=open(work / "prometheus.log", "wb"),  # noqa: SIM115
            )  # fmt: skip
            start = time.time()
            bed.apply_in(namespace, pod("broken-0", "broken", talk=False))
            wave = 0
            while time.time() - start < args.minutes * 60:
                names = [f"w{wave}-{i}" for i in range(4)]
                bed.apply_in(namespace, *(pod(n, "storage", talk=True) for n in names))
                time.sleep(50)
                if wave % 2:  # every other wave leaves, so attaches and detaches keep coming
                    bed.kubectl("delete", "pod", "-n", namespace, *names, "--wait=false")
                wave += 1
            end = time.time()
            time.sleep(10)  # the last scrape
            draw(board, port, start, end, args.out)
            print(f"wrote {args.out} ({(end - start) / 60:.1f} minutes of data, {wave} waves)")
        finally:
            if prom is not None:
                prom.terminate()
                prom.wait(10)
            bed.kubectl(
                "delete", "namespace", namespace, "--wait=true", "--timeout=120s", check=False
            )
            delete_pool(bed, f"dash-{namespace}")  # with the node's blocks in it
            driver.stop()
            subprocess.run(["ip", "link", "del", parent], check=False, capture_output=True)


def tb_free_port() -> int:
    from testbed.harness import free_port

    return free_port()


if __name__ == "__main__":
    main()
