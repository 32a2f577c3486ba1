"""`cnidra try` as users run it: a subprocess with real plugins, checked for what it prints and
for what it leaves behind (nothing, unless --keep)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cnidra.cni import netns
from tests.cni.helpers import addresses, links, sh
from tests.conftest import ROOT, RUN_TAG, CNITools

pytestmark = pytest.mark.netns
EXAMPLES = ROOT / "examples"


def namespaces() -> set[str]:
    """This run's namespaces (the `cnidra try` it starts inherits its tag): another run's on
    the machine, or another pytest-xdist worker's, are not this test's to count."""
    names = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    return {n for n in names if f"-{RUN_TAG}-" in n}


# each test's `cnidra try` runs from a machine of its own: a namespace standing in for the host
# (the links try must leave alone are that namespace's, not the real host's, which a test bed
# or another test changes meanwhile) and a TMPDIR (try's scratch directories) of its own
_machine: list[Path] = []


@pytest.fixture(autouse=True)
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    with netns.temporary("cnidra-machine") as path:
        _machine[:] = [path]
        yield path
        _machine.clear()


def on_machine() -> tuple[str, ...]:
    """Into the machine's network namespace only: `ip netns exec` would also give the command
    a mount namespace of its own, where the namespaces try adds (bind mounts under /run/netns)
    would not be seen outside it."""
    return ("nsenter", f"--net={_machine[0]}") if _machine else ()


def machine_links() -> set[str]:
    """The names of the links of the namespace try ran from."""
    listing = sh("ip", "-n", _machine[0].name, "-br", "link")
    return {line.split()[0].split("@")[0] for line in listing.splitlines()}


def scratch_dirs() -> set[str]:
    return {p.name for p in Path(os.environ["TMPDIR"]).glob("cnidra-try-*")}


def remove_scratch_dirs() -> None:
    for d in Path(os.environ["TMPDIR"]).glob("cnidra-try-*"):
        sh("rm", "-rf", str(d))


@pytest.fixture
def clean_machine(machine: Path) -> Iterator[None]:
    before_ns, before_tmp = namespaces(), scratch_dirs()
    before_links = machine_links()
    yield
    assert namespaces() == before_ns
    assert scratch_dirs() == before_tmp
    assert machine_links() == before_links
    assert not Path("/var/lib/cni/networks/macvlan-data").exists()


def cnidra_try(
    tools: CNITools, *args: str, prefix: tuple[str, ...] = (), state: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CNIDRA_CNI_PATH": tools.plugins}
    cmd = [*on_machine(), *prefix, sys.executable, "-m", "cnidra", "try", *args]
    if state:
        cmd += ["--state-dir", str(state)]
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )


def test_success_prints_the_status_and_leaves_nothing(
    cni_tools: CNITools, clean_machine: None
) -> None:
    out = cnidra_try(cni_tools, str(EXAMPLES / "macvlan-claim.yaml"))
    assert out.returncode == 0, out.stderr
    [device] = yaml.safe_load(out.stdout)["status"]["devices"]
    assert device["driver"] == "cni.dra.networking.x-k8s.io"
    # the claim selects its link by attribute: a stand-in for the allocated one
    assert device["pool"] == "cnidra-try" and device["device"] == "allocated0"
    [cond] = device["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "Ready",
        "True",
        "NetworkInterfaceReady",
    )
    assert device["networkData"]["interfaceName"] == "net1"
    assert device["networkData"]["ips"][0].startswith("198.18.10.")
    assert device["networkData"]["hardwareAddress"] == device["data"]["interfaces"][0]["mac"]
    # the claim's addresses are the file's CNIIPPool's, handed out locally: said once
    assert device["networkData"]["ips"] == ["198.18.10.2/24"]  # .1 is the pool's gateway
    assert device["data"]["ips"][0]["gateway"] == "198.18.10.1"
    [note] = [line for line in out.stderr.splitlines() if line.startswith("note:")]
    assert "CNIIPPool data for network macvlan-data" in note
    assert "cluster-wide" in note and "only locally" in note
    assert "nothing left behind" in out.stderr


def test_failed_add_rolls_back_prints_not_ready_and_exits_1(
    cni_tools: CNITools, clean_machine: None
) -> None:
    out = cnidra_try(cni_tools, str(EXAMPLES / "invalid" / "failing-ipam.yaml"), "-o", "json")
    assert out.returncode == 1
    [device] = json.loads(out.stdout)["status"]["devices"]
    [cond] = device["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", "NetworkInterfaceNotReady")
    assert "no IP addresses available" in cond["message"] and "bridge" in cond["message"]
    assert "data" not in device


def test_second_attachment_failing_rolls_back_the_first(
    cni_tools: CNITools, tmp_path: Path, clean_machine: None
) -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / "two-networks-claim.yaml").read_text()))
    [claim] = [d for d in docs if d["kind"] == "ResourceClaim"]
    storage = claim["spec"]["devices"]["config"][1]["opaque"]["parameters"]
    assert '"pool": "storage"' in storage["config"]
    storage["config"] = storage["config"].replace('"isGateway": false', '"isGateway": true')
    # the storage network's pool, shrunk to one address, its gateway: none left for the pod
    [pool] = [d for d in docs if d["kind"] == "CNIIPPool" and d["metadata"]["name"] == "storage"]
    pool["spec"].update(blockSize=4, ranges=[{
        "subnet": "198.51.100.0/30", "rangeStart": "198.51.100.1", "rangeEnd": "198.51.100.1",
        "gateway": "198.51.100.1",
    }])  # fmt: skip
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    out = cnidra_try(cni_tools, str(path))
    assert out.returncode == 1
    first, second = yaml.safe_load(out.stdout)["status"]["devices"]
    assert first["conditions"][0]["status"] == "False"
    assert "rolled back because" in first["conditions"][0]["message"]
    assert "no IP addresses available" in second["conditions"][0]["message"]


def test_a_pool_in_the_input_is_handed_out_as_the_driver_would(
    cni_tools: CNITools, clean_machine: None
) -> None:
    """examples/dual-stack-pool.yaml: one address of each family, none of the pool's excluded
    /28, its gateway the plugin's."""
    out = cnidra_try(cni_tools, str(EXAMPLES / "dual-stack-pool.yaml"), "-o", "json")
    assert out.returncode == 0, out.stderr
    [device] = json.loads(out.stdout)["status"]["devices"]
    v4, v6 = device["networkData"]["ips"]
    assert v4 == "198.18.20.16/24" and v6.startswith("2001:db8:20::") and v6.endswith("/64")
    assert device["data"]["ips"][0]["gateway"] == "198.18.20.1"
    assert out.stderr.count("note:") == 1 and "CNIIPPool data-dual" in out.stderr


def test_a_pool_not_in_the_input_is_named(cni_tools: CNITools, tmp_path: Path) -> None:
    """try reads no cluster: a claim whose network names a CNIIPPool the file lacks is refused
    before any plugin runs, naming the pool and what to do, as try's other input errors."""
    docs = list(yaml.safe_load_all((EXAMPLES / "macvlan-claim.yaml").read_text()))
    path = tmp_path / "no-pool.yaml"
    path.write_text(yaml.safe_dump_all([d for d in docs if d["kind"] != "CNIIPPool"]))
    out = cnidra_try(cni_tools, str(path))
    assert out.returncode == 2, out.stderr
    assert "CNIIPPool data, which is not in the input" in out.stderr
    assert "add the CNIIPPool data" in out.stderr and "to the file" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_host_local_over_a_pool() -> None:
    """The pool's ranges as host-local reads them: one range set per family, the excluded
    addresses cut out, the gateway kept (host-local skips it), the pool's routes before the
    network's own."""
    from cnidra.api.ipam import pool_from_object
    from cnidra.cli.try_ import host_local_ipam

    pool = pool_from_object({"metadata": {"name": "p"}, "spec": {
        "ranges": [{"subnet": "198.18.40.0/24", "rangeStart": "198.18.40.1",
                    "rangeEnd": "198.18.40.100", "gateway": "198.18.40.1"},
                   {"subnet": "2001:db8:40::/120"}],
        "exclude": ["198.18.40.16/28", "198.18.40.96/30"],
        "routes": [{"dst": "198.18.41.0/24", "gw": "198.18.40.1"}],
    }})  # fmt: skip
    ipam = host_local_ipam(pool, {"type": "cnidra", "pool": "p", "routes": [
        {"dst": "198.18.42.0/24"}]}, "here")  # fmt: skip
    v4 = [(r["rangeStart"], r["rangeEnd"]) for r in ipam["ranges"][0]]
    assert v4 == [
        ("198.18.40.1", "198.18.40.15"),
        ("198.18.40.32", "198.18.40.95"),
        ("198.18.40.100", "198.18.40.100"),
    ]
    assert {r["gateway"] for r in ipam["ranges"][0]} == {"198.18.40.1"}
    assert ipam["ranges"][1] == [
        {
            "subnet": "2001:db8:40::/120",
            "rangeStart": "2001:db8:40::1",
            "rangeEnd": "2001:db8:40::ff",
        }
    ]
    assert ipam["routes"] == [
        {"dst": "198.18.41.0/24", "gw": "198.18.40.1"},
        {"dst": "198.18.42.0/24"},
    ]
    assert ipam["type"] == "host-local" and "dataDir" not in ipam  # owned_network places it


def test_try_never_hands_out_a_pools_reserved_address() -> None:
    """A pool's reservations are cut out of host-local's ranges, and the note says so: try's
    pod is none of the pods they name (issue 41: a converted workload tried locally must not
    get db-0's address)."""
    from cnidra.api.ipam import pool_from_object
    from cnidra.cli.try_ import host_local_ipam, pool_note

    pool = pool_from_object({"metadata": {"name": "p"}, "spec": {
        "ranges": [{"subnet": "198.18.43.0/29"}], "blockSize": 8,
        "reservations": [{"address": "198.18.43.1", "pod": "t/db-0"},
                         {"address": "198.18.43.4", "pod": "t/db-1"}],
    }})  # fmt: skip
    ipam = host_local_ipam(pool, {"type": "cnidra", "pool": "p"}, "here")
    runs = [(r["rangeStart"], r["rangeEnd"]) for r in ipam["ranges"][0]]
    assert runs == [("198.18.43.2", "198.18.43.3"), ("198.18.43.5", "198.18.43.6")]
    assert "reservations are left out" in pool_note({"p": ["data"]}, {"p": pool})


def test_invalid_claim_is_refused_before_any_plugin_runs(
    cni_tools: CNITools, clean_machine: None
) -> None:
    out = cnidra_try(cni_tools, str(EXAMPLES / "invalid" / "design-review.yaml"))
    assert out.returncode == 1
    assert "hairpinMode" in out.stderr and out.stdout == ""


def test_keep_leaves_the_interface_in_place(cni_tools: CNITools) -> None:
    before = namespaces()
    out = cnidra_try(cni_tools, str(EXAMPLES / "macvlan-claim.yaml"), "--keep")
    created = namespaces() - before
    try:
        assert out.returncode == 0, out.stderr
        pod = next(n for n in created if n.startswith("cnidra-try-pod"))
        assert "net1" in links(Path("/run/netns") / pod)
        assert "kept:" in out.stderr
    finally:
        for name in created:
            sh("ip", "netns", "delete", name)
        remove_scratch_dirs()


def test_given_netns_is_used_and_not_removed(
    cni_tools: CNITools, pod_netns: Path, clean_machine: None
) -> None:
    out = cnidra_try(
        cni_tools, str(EXAMPLES / "macvlan-claim.yaml"), "--netns", str(pod_netns), "--keep"
    )
    assert out.returncode == 0, out.stderr
    [ip] = yaml.safe_load(out.stdout)["status"]["devices"][0]["networkData"]["ips"]
    assert addresses(pod_netns, "net1") == {ip}
    for name in namespaces():
        if name.startswith("cnidra-try-node"):
            sh("ip", "netns", "delete", name)
    remove_scratch_dirs()


def test_host_mode_uses_the_machine_it_runs_on(
    cni_tools: CNITools, node_netns: Path, tmp_path: Path, clean_machine: None
) -> None:
    # "the host" is a test-made namespace here: the command runs inside it with --host
    sh("ip", "-n", node_netns.name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
    sh("ip", "-n", node_netns.name, "link", "set", "eth0", "up")
    example = EXAMPLES / "macvlan-claim.yaml"
    on_host = ("--host",)
    netns_exec = ("ip", "netns", "exec", node_netns.name)
    refused = cnidra_try(cni_tools, str(example), *on_host, prefix=netns_exec, state=tmp_path)
    assert refused.returncode == 2  # the real host has no allocation to take the link from
    assert "leaves macvlan.master to the link the scheduler allocates" in refused.stderr
    named = tmp_path / "named.yaml"
    named.write_text(
        example.read_text().replace("mode: bridge", "master: eth0\n                mode: bridge")
    )
    out = cnidra_try(cni_tools, str(named), *on_host, prefix=netns_exec, state=tmp_path)
    assert out.returncode == 0, out.stderr
    device = yaml.safe_load(out.stdout)["status"]["devices"][0]
    assert device["pool"] != "cnidra-try"
    assert "network macvlan-data" in device["conditions"][0]["message"]  # the user's name
    assert not list((tmp_path / "cni" / "results").iterdir())
    # the CNIIPPool's addresses in host-local's store: cnidra's own, under the state root,
    # named by cnidra
    [pool] = (tmp_path / "ipam").iterdir()
    assert pool.name == "cnidra-ns.cnidra-try.macvlan-data"
    assert not [p for p in pool.iterdir() if p.name[0].isdigit()]


def test_usage_errors(cni_tools: CNITools, clean_machine: None) -> None:
    assert cnidra_try(cni_tools, "/nonexistent.yaml").returncode == 2
    assert (
        cnidra_try(cni_tools, str(EXAMPLES.parent / "deploy" / "deviceclass.yaml")).returncode == 2
    )
    assert (
        cnidra_try(cni_tools, str(EXAMPLES / "macvlan-claim.yaml"), "--netns", "/nope").returncode
        == 2
    )
    assert cnidra_try(cni_tools, str(EXAMPLES / "macvlan-claim.yaml"), "-o", "xml").returncode == 2


def test_netns_helpers_clean_up() -> None:
    with netns.temporary("cnidra-unit") as path:
        assert path.exists()
    assert not path.exists()


def _bare(tmp_path: Path, config: dict[str, object], name: str = "bare.yaml") -> Path:
    path = tmp_path / name
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
                "kind": "CNIConfig",
                "config": config,
            }
        )
    )
    return path


MACVLAN_STATIC = {
    "type": "macvlan",
    "master": "eth9",
    "ipam": {"type": "static", "addresses": [{"address": "198.18.31.5/24"}]},
}


def test_a_bare_cniconfig_without_ifname_is_named_as_prepare_names_it(
    cni_tools: CNITools, tmp_path: Path, clean_machine: None
) -> None:
    path = _bare(tmp_path, {"cniVersion": "1.0.0", "name": "n", **MACVLAN_STATIC})
    out = cnidra_try(cni_tools, str(path))
    assert out.returncode == 0, out.stderr
    [device] = yaml.safe_load(out.stdout)["status"]["devices"]
    assert device["networkData"]["interfaceName"] == "net1"


def test_a_plugin_error_with_brackets_is_text_not_markup(
    cni_tools: CNITools, tmp_path: Path, clean_machine: None
) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    fault = plugins / "fault-brackets"
    fault.write_text(
        '#!/bin/sh\ncat >/dev/null\n[ "$CNI_COMMAND" = DEL ] && exit 0\n'
        'printf \'{"cniVersion":"1.0.0","code":11,"msg":"[/red] broken [bold]x"}\'\nexit 1\n'
    )
    fault.chmod(0o755)
    config = {
        "cniVersion": "1.0.0",
        "name": "n",
        "plugins": [MACVLAN_STATIC, {"type": "fault-brackets"}],
    }
    path = _bare(tmp_path, config)
    env_path = f"{cni_tools.plugins}:{plugins}"
    out = subprocess.run(
        [*on_machine(), sys.executable, "-m", "cnidra", "try", str(path)],
        env={**os.environ, "CNIDRA_CNI_PATH": env_path},
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "[/red] broken [bold]x" in out.stderr and "Traceback" not in out.stderr


def test_without_root_it_says_so(cni_tools: CNITools) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as readable:  # pytest's tmp_path is root's
        Path(readable).chmod(0o755)
        path = _bare(Path(readable), {"cniVersion": "1.0.0", "name": "n", **MACVLAN_STATIC})
        path.chmod(0o644)
        nobody = ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")
        out = cnidra_try(cni_tools, str(path), prefix=nobody)
    assert out.returncode == 2, out.stderr
    assert "needs root" in out.stderr and "Traceback" not in out.stderr


def test_a_named_network_not_in_the_input_is_explained(cni_tools: CNITools, tmp_path: Path) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {"devices": {
            "requests": [
                {"name": "net", "exactly": {"deviceClassName": "cni.networking.x-k8s.io"}}
            ],
            "config": [{"opaque": {"driver": "cni.dra.networking.x-k8s.io", "parameters": {
                "apiVersion": "cni.networking.x-k8s.io/v1alpha1", "kind": "CNIConfig",
                "ifName": "net1", "network": {"name": "data"}}}}],
        }},
    }  # fmt: skip
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(claim))
    out = cnidra_try(cni_tools, str(path))
    assert out.returncode == 2 and "CNINetwork data is not in the input" in out.stderr
