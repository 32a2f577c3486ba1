"""The single-node Kubernetes test bed as a pytest session fixture: brought up (built or reused
from the cache) once, brought down after the session unless it was already running."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cnidra.state.layout import DEFAULT_STATE_ROOT
from cnidra.state.store import read_records
from testbed import cluster as tb
from testbed.harness import ROOT, Cluster, DriverProcess
from testbed.incluster import Release, wait_gone
from tests.testbed.objects import DRIVER, apply, claiming_pod, cni_config, ready, template

# the session's image build (`image`), started in the background as soon as the session holds
# the test bed, when a selected test needs the image: its minute of mmdebstrap and wheel
# building overlaps the first modules' tests, which mostly wait on kubelet
IMAGE_BUILD = pytest.StashKey[Future[tuple[str, str]]]()


def needs_image(session: pytest.Session) -> bool:
    full = os.environ.get("CNIDRA_TEST_FULL") == "1"
    return any(
        "image" in item.fixturenames or (full and "deployment" in item.fixturenames)
        for item in session.items
    )


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    from testbed.incluster import build_images

    # after the session lock: two sessions' builds would share the build's work directory
    with tb.session() as bins, ThreadPoolExecutor(1, thread_name_prefix="image") as pool:
        if needs_image(request.session):
            request.session.stash[IMAGE_BUILD] = pool.submit(build_images)
        yield Cluster(bins, tb.env_dict())


@pytest.fixture(autouse=True)
def kubelets_reconnect_after_an_apiserver_restart(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that restarted the apiserver (its pid changed), the kubelets are restarted
    once the test's own teardown is done: otherwise the next test's pods wait out their
    reflectors' backoff (tb.restart_kubelets). Set up first, so torn down last."""
    before = tb.running("kube-apiserver")
    yield
    after = tb.running("kube-apiserver")
    if before and after and after != before and "cluster" in request.fixturenames:
        cluster: Cluster = request.getfixturevalue("cluster")
        tb.restart_kubelets(cluster.bins)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    # pods are refused until the controller-manager has made the namespace's ServiceAccount
    cluster.wait(
        f"the default ServiceAccount in {name}",
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
            == 0
        ),
        60,
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def test_link(request: pytest.FixtureRequest) -> Iterator[Callable[[str], str]]:
    """Makes host-only bridges (nothing enslaved to them) that stand in for data NICs."""
    made: list[str] = []

    def make(name: str) -> str:
        subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
        made.append(name)
        return name

    yield make
    for name in made:
        subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)


@pytest.fixture
def parent(cluster: Cluster) -> Iterator[str]:
    """A test-made, host-only bridge standing in for a data NIC."""
    name = f"tb{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    subprocess.run(["ip", "link", "set", name, "up"], check=True)
    yield name
    subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)


def cnidra_crds(cluster: Cluster) -> None:
    """deploy/'s CRDs, served before this returns (the pools' and blocks' at least)."""
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds.yaml"))
    cluster.wait(
        "the CRDs to be served",
        lambda: cluster.kubectl("get", "cniippools,cniipblocks", check=False).returncode == 0,
        60,
    )


def ip_pool(name: str, subnet: str, namespaces: list[str], **range_: Any) -> dict[str, Any]:
    """An admin's CNIIPPool of one range that serves the tenants of `namespaces`."""
    return {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIIPPool",
        "metadata": {"name": name},
        "spec": {
            "ranges": [{"subnet": subnet, **range_}],
            **({"namespaces": namespaces} if namespaces else {}),
        },
    }


def pool_leases(state_root: Path, pool: str | None = None) -> dict[str, dict[str, Any]]:
    """The addresses a driver with this state root has leased (of one pool, or of all),
    address -> its Lease (pool, address, block, owner `claim/<uid>/<request>` or
    `ipamclaim/...`, holder `claim <namespace>/<name>`): cnidra.state.ipam's files."""
    out = {}
    for lease in read_records(state_root / "pools" / "addresses").values():
        if pool is None or lease.get("pool") == pool:
            out[lease["address"]] = lease
    return out


@pytest.fixture
def ip_pools(cluster: Cluster) -> Iterator[Callable[..., str]]:
    """Makes CNIIPPools (a unique name each), as an admin does for tenants: `make(subnet,
    *namespaces, **range fields)` -> the pool's name, for `ipam: {type: cnidra, pool: NAME}`.
    Deleted at the end with the blocks nodes reserved in them."""
    cnidra_crds(cluster)
    made: list[str] = []

    def make(subnet: str, *namespaces: str, name: str = "", **range_: Any) -> str:
        name = name or f"tb-{uuid.uuid4().hex[:8]}"
        cluster.apply(ip_pool(name, subnet, list(namespaces), **range_))
        made.append(name)
        return name

    yield make
    for name in made:
        cluster.kubectl("delete", "cniippool", name, "--ignore-not-found", check=False)
        cluster.kubectl(
            "delete", "cniipblocks", "-l", f"cni.networking.x-k8s.io/pool={name}", check=False
        )


class Drivers:
    """`cnidra driver` host processes of one test (or module), started as the tests need them
    and all gone at the end. Each is registered with kubelet and connected to its node's NRI
    before `start` returns. `defaults`: deploy/'s state root, /var/lib/cnidra (empty before,
    removed after: one test bed runs one such driver at a time); else a state root of its
    own under `state_dir`."""

    def __init__(self, cluster: Cluster, state_dir: Path) -> None:
        self.cluster = cluster
        self.state_dir = state_dir
        self.started: list[DriverProcess] = []

    def start(
        self,
        *,
        defaults: bool = True,
        node: tb.Node = tb.NODE1,
        nri: bool = True,
        **settings: str,
    ) -> DriverProcess:
        if defaults:
            assert not DEFAULT_STATE_ROOT.exists() or not any(DEFAULT_STATE_ROOT.glob("*/*")), (
                f"{DEFAULT_STATE_ROOT} holds state of something else"
            )
        state = self.state_dir / f"driver-{len(self.started)}"
        state.mkdir(parents=True, exist_ok=True)
        if node != tb.NODE1:
            settings.setdefault("cni_conf_dir", str(node.cni_conf))
        proc = DriverProcess(self.cluster, state, defaults=defaults, node=node, **settings)
        self.started.append(proc)
        proc.start()
        if nri:
            self.cluster.wait(
                f"{node.name}'s NRI plugin to connect",
                lambda: proc.health().get("nriConnected"),
                60,
            )
        return proc

    def close(self, *namespaces: str, expect_no_records: bool = False) -> None:
        """The namespaces' pods deleted while the drivers run (each node's last driver, if
        stopped or frozen, is started or thawed first), so their interfaces go as users' do
        (DEL by the hook); then every driver stopped and deploy/'s state root removed.
        `expect_no_records`: no claim or sandbox record may be left in it once the pods are
        gone."""
        try:
            latest = {proc.node.name: proc for proc in self.started}  # each node's last one
            for proc in latest.values():
                if proc.proc is not None and proc.proc.poll() is None:
                    proc.proc.send_signal(signal.SIGCONT)
                elif namespaces:
                    proc.start()
            for namespace in namespaces:
                self.cluster.kubectl(
                    "delete", "pods", "--all", "-n", namespace, "--timeout=90s",
                    check=False, timeout=120,
                )  # fmt: skip
        finally:
            for proc in self.started:
                proc.stop()
            left: list[Path] = []
            if any(p.state_root == DEFAULT_STATE_ROOT for p in self.started):
                left = list(DEFAULT_STATE_ROOT.glob("[cs]*/*.json"))
                shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)
        assert not expect_no_records or not left, f"records left after the pods went: {left}"


def namespace_of(request: pytest.FixtureRequest) -> list[str]:
    """The test's `namespace`, labelled for claim configs as the chart's admission needs,
    when the test uses one."""
    if "namespace" not in request.fixturenames:
        return []
    name: str = request.getfixturevalue("namespace")
    cluster: Cluster = request.getfixturevalue("cluster")
    cluster.kubectl("label", "namespace", name, "cni.networking.x-k8s.io/claim-config=true")
    return [name]


@pytest.fixture
def start_driver(
    request: pytest.FixtureRequest, cluster: Cluster, tmp_path: Path
) -> Iterator[Callable[..., DriverProcess]]:
    """Starts `cnidra driver` as deploy/ runs it (its defaults, its state root) but for the
    settings given: `start(**settings)` -> the driver, registered and NRI-connected. deploy/'s
    CRDs and classes are installed first, and the test's namespace labelled for claim configs.
    Afterwards the namespace's pods go while the drivers run, then the drivers."""
    cluster.install_cnidra_api()
    namespaces = namespace_of(request)
    drivers = Drivers(cluster, tmp_path)
    yield drivers.start
    drivers.close(*namespaces)


@pytest.fixture
def driver(start_driver: Callable[..., DriverProcess]) -> DriverProcess:
    """One driver as deploy/ runs it (see start_driver)."""
    return start_driver()


@dataclass
class Attached:
    """What `attach` made: a pod Ready with its interface, and what it took."""

    namespace: str
    parent: str  # the test-made link the claim's macvlan hangs off
    pool: str  # the CNIIPPool its address came from
    driver: DriverProcess
    pod: str
    template: str


@pytest.fixture
def attach(
    cluster: Cluster,
    namespace: str,
    start_driver: Callable[..., DriverProcess],
    parent: str,
    ip_pools: Callable[..., str],
) -> Callable[..., Attached]:
    """A link, a driver, a claim and a pod Ready: `attach(subnet, **driver settings)` makes a
    CNIIPPool of `subnet` for the test's namespace, starts the driver (as deploy/ runs it),
    waits for its slice to carry the test's link, and applies a template of one macvlan
    network on it (net1, from the pool) and a pod that claims it; returns once the pod is
    Ready."""

    def make(subnet: str, *, pod: str = "p1", name: str = "net", **settings: str) -> Attached:
        pool = ip_pools(subnet, namespace)
        driver = start_driver(**settings)
        cluster.wait("the slice to carry the link", lambda: parent in slice_devices(cluster), 30)
        net = template(name, [(name, parent, cni_config(name, parent, pool), "net1")])
        apply(cluster, namespace, net, claiming_pod(pod, name))
        ready(cluster, namespace, pod)
        return Attached(namespace, parent, pool, driver, pod, name)

    return make


def slice_devices(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The devices of cnidra's ResourceSlices (every node's), by name."""
    slices = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    return {
        d["name"]: d for s in slices if s["spec"]["driver"] == DRIVER for d in s["spec"]["devices"]
    }


@pytest.fixture(scope="module")
def node2_driver(
    request: pytest.FixtureRequest,
    cluster: Cluster,
    second_node: tb.Node,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DriverProcess]:
    """Node 2's driver for the module's tests: a host process in node 2's network namespace,
    reading node 2's CNI conf dir, with a state root of its own (two drivers on one machine
    cannot share deploy/'s) and the module's NODE2_SETTINGS."""
    cluster.install_cnidra_api()
    drivers = Drivers(cluster, tmp_path_factory.mktemp("node2"))
    settings: dict[str, str] = getattr(request.module, "NODE2_SETTINGS", {})
    yield drivers.start(defaults=False, node=second_node, **settings)
    drivers.close()


@pytest.fixture(scope="module")
def second_node(cluster: Cluster) -> Iterator[tb.Node]:
    """The test bed's second node (tainted: only pods that tolerate it land there), up for the
    module's tests."""
    tb.node2_up(cluster.bins)
    try:
        yield tb.NODE2
    finally:
        tb.node2_down(cluster.bins)


@pytest.fixture(scope="session")
def image(request: pytest.FixtureRequest, cluster: Cluster) -> str:
    """`make image`'s image and `make image-cni-plugins`' (the reinstall test's), built once per
    session from one build and loaded into the test bed's containerd; the plain one's digest."""
    from testbed.incluster import PLUGINS_IMAGE_ARCHIVE, build_images, load_image

    build = request.session.stash.get(IMAGE_BUILD, None)
    digest, _ = build.result(timeout=900) if build else build_images()
    load_image(cluster)
    load_image(cluster, PLUGINS_IMAGE_ARCHIVE)
    return digest


# `make test` runs the e2e suite against the host driver, and proves the in-cluster driver by
# test_incluster.py, which takes each in-cluster path once; `make test-full` (CNIDRA_TEST_FULL=1,
# nightly) runs every test that uses `deployment` against both.
DEPLOYMENTS = ["host", "in-cluster"] if os.environ.get("CNIDRA_TEST_FULL") == "1" else ["host"]


@pytest.fixture(scope="module", params=DEPLOYMENTS)
def deployment(
    request: pytest.FixtureRequest, cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release | None]:
    """Every test of a module that uses it runs against `cnidra driver` as a host process
    (None: the module starts it), and under `make test-full` also against the DaemonSet pod of
    a `helm install` of the image (its defaults)."""
    if request.param == "host":
        yield None
        return
    request.getfixturevalue("image")
    release = Release(cluster, tmp_path_factory.mktemp("release") / "values.yaml")
    assert not DEFAULT_STATE_ROOT.exists() or not any(DEFAULT_STATE_ROOT.glob("*/*")), (
        f"{DEFAULT_STATE_ROOT} holds state of something else"
    )
    release.install()
    try:
        yield release
    finally:
        release.uninstall()
        wait_gone(cluster)
        left = [p for p in DEFAULT_STATE_ROOT.glob("[cs]*/*.json")]
        shutil.rmtree(DEFAULT_STATE_ROOT, ignore_errors=True)
        assert not left, f"claims or sandboxes left after the last pod went: {left}"
