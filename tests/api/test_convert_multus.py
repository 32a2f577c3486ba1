"""Issue 41: a Multus shop migrates with `cnidra convert` and nothing changes silently. What
convert emits passes the shipped policy or is refused naming the field; interfaces keep the
names Multus gave them; containers wait for their interfaces; a workload without its NADs, an
SR-IOV or a macvtap network is refused; what whereabouts holds is never handed out again."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cnidra.api.convert import (
    SHIPPED_CLASS,
    Conversion,
    ConvertError,
    Held,
    convert,
    read_all,
    read_held,
)
from cnidra.api.multus import NETWORKS_ANNOTATION, pod_template
from cnidra.api.validate import validate_documents
from cnidra.cli.main import app

ROOT = Path(__file__).parents[2]
SHIPPED = ROOT / "deploy" / "deviceclass.yaml"


def shipped_verdict(docs: list[dict[str, Any]], context: Sequence[Any] = ()) -> list[str]:
    policy = [d for d in yaml.safe_load_all(SHIPPED.read_text()) if d]
    reports = validate_documents(docs, [*policy, *context])
    return [f"{r.kind}/{r.name}: {i.path}: {i.message}" for r in reports for i in r.issues.errors]


def nad(
    name: str,
    config: dict[str, Any],
    namespace: str = "t",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": meta,
        "spec": {"config": json.dumps(config)},
    }


def macvlan(
    ipam: dict[str, Any] | None = None, master: str = "eth1", **more: Any
) -> dict[str, Any]:
    config: dict[str, Any] = {"cniVersion": "1.0.0", "type": "macvlan", "master": master}
    if ipam is not None:
        config["ipam"] = ipam
    return {**config, **more}


POOLED = {"type": "cnidra", "pool": "p"}


def deployment(annotation: str, name: str = "app", namespace: str = "t") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": {"app": name},
                    "annotations": {NETWORKS_ANNOTATION: annotation},
                },
                "spec": {
                    "initContainers": [{"name": "init", "image": "i"}],
                    "containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}],
                },
            },
        },
    }


def run(*docs: dict[str, Any], **options: Any) -> Conversion:
    found = read_all(yaml.safe_dump_all(docs), "have.yaml")
    return convert(found.sources, found.workloads, held=found.held, **options)


def params_of(template: dict[str, Any] | Conversion) -> list[dict[str, Any]]:
    if isinstance(template, Conversion):
        [template] = [d for d in template.docs if d["kind"] == "ResourceClaimTemplate"]
    configs = template["spec"]["spec"]["devices"]["config"]
    return [c["opaque"]["parameters"] for c in configs]


def cli(tmp_path: Path, *docs: Any, args: tuple[str, ...] = (), text: str | None = None) -> Any:
    path = tmp_path / "input.yaml"
    path.write_text(text if text is not None else yaml.safe_dump_all(docs))
    return CliRunner().invoke(app, ["convert", *args, str(path)])


# ------------------------------------------------------------------ the shipped class


def test_the_built_in_class_is_the_one_deploy_ships() -> None:
    shipped = [d for d in yaml.safe_load_all(SHIPPED.read_text()) if d]
    [default] = [d for d in shipped if d["metadata"]["name"] == SHIPPED_CLASS["metadata"]["name"]]
    assert default["spec"] == SHIPPED_CLASS["spec"]
    assert default["apiVersion"] == SHIPPED_CLASS["apiVersion"]


# ------------------------------------------------------------------ names and the gate


def test_unnamed_networks_keep_multus_positional_names() -> None:
    """Multus names an unnamed network net<N> by its place, counting named ones too."""
    result = run(
        nad("a", macvlan(POOLED)),
        nad("b", macvlan(POOLED, master="eth2")),
        nad("c", macvlan(POOLED, master="eth3")),
        deployment("a@data0, b, c"),
    )
    assert not result.refused, result.refused
    template, _ = result.docs
    assert [p["ifName"] for p in params_of(template)] == ["data0", "net2", "net3"]
    assert shipped_verdict(result.docs) == []


def test_every_container_lists_the_claim_so_the_gate_holds_it() -> None:
    result = run(nad("a", macvlan(POOLED)), deployment("a"))
    assert not result.refused, result.refused
    pod = pod_template(result.docs[1])
    assert pod is not None
    for key in ("initContainers", "containers"):
        for container in pod["spec"][key]:
            assert container["resources"]["claims"] == [{"name": "networks"}], container
    assert pod["spec"]["resourceClaims"] == [
        {"name": "networks", "resourceClaimTemplateName": "app-networks"}
    ]


def test_a_claim_named_networks_already_there_is_kept() -> None:
    workload = deployment("a")
    spec = workload["spec"]["template"]["spec"]
    spec["resourceClaims"] = [{"name": "networks", "resourceClaimTemplateName": "gpu"}]
    spec["containers"][0]["resources"] = {"claims": [{"name": "networks"}]}
    result = run(nad("a", macvlan(POOLED)), workload)
    assert not result.refused, result.refused
    pod = pod_template(result.docs[1])
    assert pod is not None
    assert [c["name"] for c in pod["spec"]["resourceClaims"]] == ["networks", "networks-2"]
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "networks"},
        {"name": "networks-2"},
    ]


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    "docs",
    [
        pytest.param([deployment("a")], id="no-nad"),
        pytest.param([nad("a", macvlan(POOLED)), deployment("a, other/b")], id="one-missing"),
    ],
)
def test_a_workload_without_its_nads_is_refused(docs: list[dict[str, Any]]) -> None:
    result = run(*docs)
    assert result.docs == []
    [refused] = result.refused
    assert refused.startswith("Deployment t/app: NetworkAttachmentDefinition")
    assert "is not in the input" in refused and "kubectl get net-attach-def -n t" in refused


def test_an_sriov_workload_without_its_nad_exits_1(tmp_path: Path) -> None:
    result = cli(tmp_path, deployment("sriov-net"))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "not converted: Deployment t/app" in " ".join(result.stderr.split())


def test_an_sriov_workload_is_refused_with_its_nad() -> None:
    sriov = nad(
        "vf",
        {"cniVersion": "1.0.0", "type": "sriov", "vlan": 100},
        annotations={"k8s.v1.cni.cncf.io/resourceName": "intel.com/sriov"},
    )
    result = run(sriov, deployment("vf"))
    [refused] = result.refused
    assert "SR-IOV" in refused and result.docs == []


@pytest.mark.parametrize("reference", [False, True])
def test_a_macvtap_nad_is_refused_as_macvtap(reference: bool) -> None:
    macvtap = nad(
        "vmnet",
        {"cniVersion": "0.3.1", "name": "vmnet", "type": "macvtap", "mtu": 1500},
        annotations={"k8s.v1.cni.cncf.io/resourceName": "macvtap.network.kubevirt.io/eth1"},
    )
    result = run(macvtap, reference=reference)
    [refused] = result.refused
    assert "KubeVirt macvtap network" in refused and "on eth1" in refused
    assert "SR-IOV" not in refused


@pytest.mark.parametrize("reference", [False, True])
def test_an_sriov_nad_is_refused_with_or_without_reference(reference: bool) -> None:
    sriov = nad(
        "vf",
        {"cniVersion": "1.0.0", "type": "sriov"},
        annotations={"k8s.v1.cni.cncf.io/resourceName": "intel.com/sriov"},
    )
    [refused] = run(sriov, reference=reference).refused
    assert "SR-IOV" in refused


def test_promisc_tuning_is_refused_naming_the_field() -> None:
    config = {
        "cniVersion": "1.0.0",
        "name": "prom",
        "plugins": [macvlan(POOLED), {"type": "tuning", "promisc": True}],
    }
    result = run(nad("prom", config))
    assert result.docs == []
    [refused] = result.refused
    assert "plugins[1].promisc" in refused and "never claim-settable" in refused


@pytest.mark.parametrize(
    ("ipam", "field"),
    [
        pytest.param(
            {"type": "whereabouts", "range": "198.18.5.0/24"}, "ipam.type", id="whereabouts"
        ),
        pytest.param(
            {"type": "host-local", "subnet": "198.18.6.0/24", "dataDir": "/run/x"},
            "ipam.type",
            id="host-local-dataDir",
        ),
    ],
)
def test_reference_mode_refuses_what_prepare_would(ipam: dict[str, Any], field: str) -> None:
    result = run(nad("n", macvlan(ipam)), reference=True)
    assert result.docs == []
    [refused] = result.refused
    assert field in refused and "without --reference" in refused


def test_reference_mode_emits_what_passes() -> None:
    source = nad("ok", macvlan(POOLED))
    result = run(source, reference=True)
    assert not result.refused
    assert shipped_verdict(result.docs, [source]) == []


def test_the_policy_option_lets_an_admin_class_decide(tmp_path: Path) -> None:
    """An admin class that allows a plugin the shipped one does not: convert checks against it."""
    admin = json.loads(json.dumps(SHIPPED_CLASS))
    policy = admin["spec"]["config"][0]["opaque"]["parameters"]["claims"]
    policy["plugins"] = [*policy["plugins"], "host-device"]
    (tmp_path / "class.yaml").write_text(yaml.safe_dump(admin))
    config = {"cniVersion": "1.0.0", "type": "host-device", "device": "eth5", "ipam": POOLED}
    refused = cli(tmp_path, nad("hd", config))
    assert refused.exit_code == 1 and "host-device" in refused.stderr
    allowed = cli(tmp_path, nad("hd", config), args=("--policy", str(tmp_path / "class.yaml")))
    assert allowed.exit_code == 0, allowed.stderr
    assert "kind: ResourceClaimTemplate" in allowed.stdout


# ------------------------------------------------------------------ options and input errors


@pytest.mark.parametrize(
    ("if_name", "said"),
    [
        ("eth0", "primary interface"),
        ("x" * 24, "is 24 bytes; Linux allows at most 15"),
        ("a/b", "must not contain '/'"),
    ],
)
def test_if_name_is_checked_as_ifname_is(tmp_path: Path, if_name: str, said: str) -> None:
    result = cli(tmp_path, nad("a", macvlan(POOLED)), args=("--if-name", if_name))
    assert result.exit_code == 2
    assert said in " ".join(result.stderr.split()) and "--if-name" in result.stderr


def test_if_name_is_refused_for_several_nads_and_for_workloads() -> None:
    with pytest.raises(ConvertError, match="names one interface"):
        run(nad("a", macvlan(POOLED)), nad("b", macvlan(POOLED)), if_name="data0")
    with pytest.raises(ConvertError, match="networks annotation"):
        run(nad("a", macvlan(POOLED)), deployment("a"), if_name="data0")


def test_objects_run_together_name_the_file_once_and_say_what_is_missing(tmp_path: Path) -> None:
    upf = yaml.safe_dump(deployment("a"))
    nads = yaml.safe_dump(nad("a", macvlan(POOLED)))
    result = cli(tmp_path, text=upf + nads)  # `cat upf.yaml nads.yaml`: no `---`
    assert result.exit_code == 2
    said = " ".join(result.stderr.split())
    assert said.count("input.yaml") == 1
    assert "duplicate key 'apiVersion'" in said and "---" in said


# ------------------------------------------------------------------ what Multus carried


def test_ips_a_plugin_does_not_take_changes_nothing_and_says_so() -> None:
    result = run(
        nad("a", macvlan({"type": "host-local", "subnet": "198.18.61.0/24"})),
        deployment('[{"name": "a", "ips": ["198.18.61.9/24"], "mac": "02:00:00:00:00:01"}]'),
    )
    assert not result.refused, result.refused
    said = [n for n in result.notes if "asks" in n]
    assert len(said) == 2 and all("no effect under Multus" in n for n in said)
    assert params_of(result)[0]["config"]["ipam"]["type"] == "cnidra"


def test_ips_host_local_takes_become_static_addresses_of_the_pool() -> None:
    config = macvlan({"type": "host-local", "subnet": "198.18.62.0/24"}, capabilities={"ips": True})
    result = run(nad("a", config), deployment('[{"name": "a", "ips": ["198.18.62.9/24"]}]'))
    assert not result.refused, result.refused
    [ipam] = [p["config"]["ipam"] for p in params_of(result)]
    assert ipam == {
        "type": "static",
        "addresses": [{"address": "198.18.62.9/24", "gateway": "198.18.62.1"}],
    }
    assert any("carried as static addresses" in n for n in result.notes)
    assert shipped_verdict(result.docs) == []


def test_ips_outside_the_pool_are_not_carried() -> None:
    config = macvlan({"type": "host-local", "subnet": "198.18.62.0/24"}, capabilities={"ips": True})
    result = run(nad("a", config), deployment('[{"name": "a", "ips": ["198.18.63.9/24"]}]'))
    assert any("not carried" in n and "198.18.63.9/24" in n for n in result.notes)
    [ipam] = [p["config"]["ipam"] for p in params_of(result)]
    assert ipam["type"] == "cnidra"


def test_ips_static_takes_replace_its_addresses() -> None:
    config = macvlan({"type": "static"}, capabilities={"ips": True})
    result = run(nad("a", config), deployment('[{"name": "a", "ips": ["198.18.64.9/24"]}]'))
    [ipam] = [p["config"]["ipam"] for p in params_of(result)]
    assert ipam == {"type": "static", "addresses": [{"address": "198.18.64.9/24"}]}
    assert any("CNIIPPool" in n and "leases" in n for n in result.notes)


def test_default_route_is_named() -> None:
    result = run(
        nad("a", macvlan(POOLED)), deployment('[{"name": "a", "default-route": ["198.18.0.1"]}]')
    )
    assert any("default-route" in n and "not carried" in n for n in result.notes)


# ------------------------------------------------------------------ whereabouts' addresses


def ippool(range_: str, allocations: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
        "kind": "IPPool",
        "metadata": {"name": range_.replace("/", "-"), "namespace": "kube-system"},
        "spec": {"range": range_, "allocations": allocations},
    }


def reservation(name: str, pod: str) -> dict[str, Any]:
    return {
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
        "kind": "OverlappingRangeIPReservation",
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"containerid": "c", "podref": pod},
    }


def test_whereabouts_held_addresses_become_reservations_for_their_pods() -> None:
    wb = {"type": "whereabouts", "range": "198.18.70.0/24", "exclude": ["198.18.70.0/28"]}
    result = run(
        nad("a", macvlan(wb)),
        deployment("a"),
        ippool(
            "198.18.70.0/24",
            {
                "20": {"id": "c1", "podref": "t/db-0"},
                "21": {"id": "c2", "podref": "t/db-1"},
                "5": {"id": "c3", "podref": "t/old"},  # in the exclude: never handed out
                "30": {"id": "c4", "podref": "?"},  # no pod name: excluded instead
            },
        ),
        reservation("198.18.70.40", "t/web-x"),
        reservation("198.18.99.1", "t/elsewhere"),  # another range: not this pool's
    )
    assert not result.refused, result.refused
    pool = result.docs[0]
    assert pool["kind"] == "CNIIPPool"
    assert pool["spec"]["reservations"] == [
        {"address": "198.18.70.20", "pod": "t/db-0"},
        {"address": "198.18.70.21", "pod": "t/db-1"},
        {"address": "198.18.70.40", "pod": "t/web-x"},
    ]
    assert pool["spec"]["exclude"] == ["198.18.70.0/28", "198.18.70.30/32"]
    [said] = [n for n in result.notes if "whereabouts holds" in n]
    assert "198.18.70.20 (t/db-0)" in said and "StatefulSet" in said
    assert "198.18.70.30 (?)" in said and "exclude instead" in said
    assert shipped_verdict(result.docs) == []


async def test_a_converted_pool_gives_a_statefulset_pod_its_whereabouts_address(
    tmp_path: Path,
) -> None:
    """The migration end to end in the allocator: the pool convert emits, as the apiserver
    keeps it, gives db-0 the address whereabouts gave it and never gives web-x's to anyone."""
    from tests.ipam.fakes import FakeApiserver, addresses_of, claim_using, node_allocator

    result = run(
        nad("a", macvlan({"type": "whereabouts", "range": "198.18.72.0/28"})),
        deployment("a"),
        ippool("198.18.72.0/28", {"3": {"podref": "t/db-0"}, "4": {"podref": "t/web-x"}}),
    )
    pool = result.docs[0]
    api = FakeApiserver()
    api.pool(pool["metadata"]["name"], pool["spec"])
    node = node_allocator(api, tmp_path, "n1")
    name = pool["metadata"]["name"]
    got = await node.assign(claim_using(name, "u0", namespace="t"), ["db-0"])
    assert addresses_of(got) == ["198.18.72.3/28"]
    others = [
        addresses_of(await node.assign(claim_using(name, f"u{i}", namespace="t"), [f"new-{i}"]))
        for i in range(1, 6)
    ]
    assert ["198.18.72.4/28"] not in others and ["198.18.72.3/28"] not in others


def test_whereabouts_ipv6_reservation_names_are_read() -> None:
    held, notes = read_held([reservation("fd00--5", "t/a"), reservation("mynet-fd00--6", "t/b")])
    addresses = {h.address for h in held}
    assert ipaddress.ip_address("fd00::5") in addresses
    assert ipaddress.ip_address("fd00::6") in addresses
    assert notes == []


def test_whereabouts_objects_that_cannot_be_read_are_said() -> None:
    held, notes = read_held(
        [
            ippool("nonsense", {"1": {"podref": "t/a"}}),
            ippool("198.18.0.0/24", {"x": {}, "999": {}}),
        ]
    )
    assert held == []
    assert len(notes) == 2 and "not a CIDR" in notes[0] and "x" in notes[1]


def test_without_whereabouts_objects_the_note_says_how_to_give_them() -> None:
    result = run(
        nad("a", macvlan({"type": "whereabouts", "range": "198.18.71.0/24"})), deployment("a")
    )
    assert any("kubectl get ippools.whereabouts.cni.cncf.io" in n for n in result.notes)


# ------------------------------------------------------------------ the property


PLUGIN_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "mode": st.sampled_from(["bridge", "private", "vepa", "passthru", "bogus"]),
        "mtu": st.integers(min_value=-1, max_value=70000),
        "promisc": st.booleans(),
        "dataDir": st.just("/var/lib/x"),
        "capabilities": st.fixed_dictionaries(
            {}, optional={"ips": st.booleans(), "mac": st.booleans()}
        ),
    },
)
IPAMS = st.one_of(
    st.none(),
    st.just(POOLED),
    st.builds(
        lambda n: {"type": "host-local", "subnet": f"198.18.{n}.0/24", "dataDir": "/x"},
        st.integers(0, 255),
    ),
    st.builds(lambda n: {"type": "whereabouts", "range": f"198.18.{n}.0/24"}, st.integers(0, 255)),
    st.just({"type": "static"}),
    st.just({"type": "dhcp"}),
)
TYPES = st.sampled_from(["macvlan", "ipvlan", "bridge", "host-device", "sriov", "macvtap", "ptp"])
TUNING = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"type": st.just("tuning")},
        optional={
            "promisc": st.booleans(),
            "mtu": st.integers(0, 9000),
            "mac": st.just("02:00:00:00:00:09"),
        },
    ),
)
ELEMENT = st.fixed_dictionaries(
    {},
    optional={
        "interface": st.sampled_from(["net1", "net2", "data0", "eth0", "x" * 20, "a b"]),
        "ips": st.lists(st.sampled_from(["198.18.3.9/24", "198.18.4.9/24", "bad"]), max_size=2),
        "mac": st.just("02:00:00:00:00:01"),
        "default-route": st.just(["198.18.3.1"]),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    networks=st.lists(
        st.tuples(TYPES, PLUGIN_FIELDS, IPAMS, TUNING, ELEMENT), min_size=1, max_size=3
    ),
    reference=st.booleans(),
    workload=st.booleans(),
)
def test_what_convert_emits_passes_the_shipped_policy_or_is_refused(
    networks: list[
        tuple[str, dict[str, Any], dict[str, Any] | None, dict[str, Any] | None, dict[str, Any]]
    ],
    reference: bool,
    workload: bool,
) -> None:
    docs: list[dict[str, Any]] = []
    elements = []
    for i, (kind, fields, ipam, tuning, element) in enumerate(networks):
        plugin: dict[str, Any] = {"type": kind, "master": f"eth{i + 1}", **fields}
        if ipam is not None:
            plugin["ipam"] = ipam
        config: dict[str, Any] = {"cniVersion": "1.0.0", "name": f"n{i}"}
        config["plugins"] = [plugin, tuning] if tuning else [plugin]
        docs.append(nad(f"n{i}", config))
        elements.append({"name": f"n{i}", **element})
    if workload:
        docs.append(deployment(json.dumps(elements)))
    try:
        result = run(*docs, reference=reference and not workload)
    except ConvertError:
        return  # refused as a whole, as a usage error: nothing emitted
    context = docs if reference and not workload else []
    assert shipped_verdict(result.docs, context) == []
    if workload and not result.refused:
        template = result.docs[-2]
        names = [p["ifName"] for p in params_of(template)]
        for position, element in enumerate(elements, start=1):
            assert names[position - 1] == element.get("interface", f"net{position}")


def test_held_is_a_value() -> None:
    held = Held(ipaddress.ip_address("192.0.2.1"), "t/a", "x")
    assert held == Held(ipaddress.ip_address("192.0.2.1"), "t/a", "x")


BENIGN: st.SearchStrategy[Any] = st.tuples(
    st.sampled_from(["macvlan", "ipvlan", "bridge"]),
    st.just({}),
    st.sampled_from([POOLED, {"type": "host-local", "subnet": "198.18.3.0/24"}, None]),
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "interface": st.sampled_from(["data0", "data1", "net7"]),
            "ips": st.just(["198.18.3.9/24"]),
        },
    ),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(networks=st.lists(BENIGN, min_size=1, max_size=3))
def test_workloads_of_ordinary_networks_convert_with_multus_names(
    networks: list[tuple[str, dict[str, Any], dict[str, Any] | None, None, dict[str, Any]]],
) -> None:
    docs: list[dict[str, Any]] = []
    elements = []
    for i, (kind, _, ipam, _, element) in enumerate(networks):
        plugin: dict[str, Any] = {"type": kind, "cniVersion": "1.0.0"}
        plugin["bridge" if kind == "bridge" else "master"] = f"eth{i + 1}"
        if ipam is not None:
            plugin["ipam"] = ipam
        docs.append(nad(f"n{i}", plugin))
        elements.append({"name": f"n{i}", **element})
    docs.append(deployment(json.dumps(elements)))
    result = run(*docs)
    names = [e.get("interface", f"net{p}") for p, e in enumerate(elements, start=1)]
    if len(set(names)) < len(names):  # two networks asked one name: Multus fails too
        assert result.refused and not result.docs
        return
    assert not result.refused, result.refused
    assert shipped_verdict(result.docs) == []
    assert [p["ifName"] for p in params_of(result)] == names


ODD = st.one_of(
    st.none(),
    st.integers(-5, 300),
    st.sampled_from(
        ["198.18.9.0/24", "198.18.9.7", "fd00::/64", "fd00::9", "bogus", "", "-", "1-2/3"]
    ),
    st.lists(st.sampled_from(["198.18.9.0/28", "bogus", "fd00::/120"]), max_size=3),
    st.dictionaries(st.sampled_from(["range", "podref", "id"]), st.just("x"), max_size=2),
)
WHEREABOUTS = st.fixed_dictionaries(
    {"type": st.just("whereabouts")},
    optional={
        "range": ODD,
        "range_start": ODD,
        "range_end": ODD,
        "gateway": ODD,
        "exclude": ODD,
        "ipRanges": st.one_of(
            ODD,
            st.lists(
                st.dictionaries(st.sampled_from(["range", "exclude", "gateway"]), ODD), max_size=3
            ),
        ),
    },
)
WHEREABOUTS_OBJECTS = st.lists(
    st.builds(
        lambda kind, name, spec: {
            "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
            "kind": kind,
            "metadata": {"name": name},
            "spec": spec,
        },
        st.sampled_from(["IPPool", "OverlappingRangeIPReservation"]),
        st.sampled_from(["198.18.9.7", "fd00--9", "net-fd00--", "x", "", "198-18-9-7"]),
        st.fixed_dictionaries(
            {},
            optional={
                "range": ODD,
                "podref": ODD,
                "allocations": st.one_of(
                    ODD,
                    st.dictionaries(
                        st.sampled_from(["1", "7", "-1", "x", "99999999999"]), ODD, max_size=3
                    ),
                ),
            },
        ),
    ),
    max_size=4,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ipam=WHEREABOUTS, objects=WHEREABOUTS_OBJECTS, workload=st.booleans())
def test_any_whereabouts_input_is_converted_or_refused_never_a_traceback(
    ipam: dict[str, Any], objects: list[dict[str, Any]], workload: bool
) -> None:
    docs = [nad("a", macvlan(ipam)), *objects]
    if workload:
        docs.append(deployment("a"))
    try:
        result = run(*docs)
    except ConvertError:
        return
    assert result.docs or result.refused
    assert shipped_verdict(result.docs) == []
    for pool in [d for d in result.docs if d["kind"] == "CNIIPPool"]:
        for held in read_held(objects)[0]:
            for r in pool["spec"]["ranges"]:
                subnet = ipaddress.ip_network(r["subnet"])
                if held.address.version == subnet.version and held.address in subnet:
                    excluded = [ipaddress.ip_network(x) for x in pool["spec"]["exclude"]]
                    assert any(held.address in n for n in excluded)


@pytest.mark.parametrize("form", ["yaml", "json"])
def test_a_kubectl_list_of_nads_alone_or_as_json_is_read(form: str) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [nad("a", macvlan(POOLED))]}
    text = json.dumps(listed) if form == "json" else yaml.safe_dump(listed)
    found = read_all(text, "nads")
    assert [s.name for s in found.sources] == ["a"] and found.workloads == []
    result = convert(found.sources)
    assert not result.refused and [d["kind"] for d in result.docs] == ["ResourceClaimTemplate"]


@pytest.mark.parametrize(
    "args", [("--reference",), ("--kind", "ResourceClaim"), ("--name", "x"), ("--if-name", "d0")]
)
def test_options_for_nads_are_refused_with_workloads(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = cli(tmp_path, nad("a", macvlan(POOLED)), deployment("a"), args=args)
    assert result.exit_code == 2 and result.stdout == ""
    assert args[0] in result.stderr


# ------------------------------------------------------------------ persistent IPs


def test_allow_persistent_ips_becomes_the_pools_and_the_reference_the_claims() -> None:
    config = macvlan({"type": "whereabouts", "range": "198.18.73.0/24"}, allowPersistentIPs=True)
    element = json.dumps([{"name": "a", "ipam-claim-reference": "vm-a.data"}])
    result = run(nad("a", config), deployment(element))
    assert not result.refused, result.refused
    [pool] = [d for d in result.docs if d["kind"] == "CNIIPPool"]
    assert pool["spec"]["allowPersistentIPs"] is True
    [params] = params_of(result)
    assert params["ipamClaimReference"] == "vm-a.data"
    assert "allowPersistentIPs" not in json.dumps(params["config"])
    assert any("IPAMClaim t/vm-a.data" in n for n in result.notes)
    assert not any("ipam-claim-reference" in n and "not carried" in n for n in result.notes)
    assert shipped_verdict(result.docs) == []


def test_a_reference_without_persistent_ips_is_named_not_carried() -> None:
    element = json.dumps([{"name": "a", "ipam-claim-reference": "vm-a.data"}])
    result = run(
        nad("a", macvlan({"type": "whereabouts", "range": "198.18.74.0/24"})), deployment(element)
    )
    assert not result.refused, result.refused
    [params] = params_of(result)
    assert "ipamClaimReference" not in params
    assert any("ipam-claim-reference" in n and "not carried" in n for n in result.notes)


def test_allow_persistent_ips_without_a_pool_is_named() -> None:
    config = macvlan(
        {"type": "static", "addresses": [{"address": "198.18.75.2/24"}]}, allowPersistentIPs=True
    )
    result = run(nad("a", config), deployment("a"))
    assert any("allowPersistentIPs dropped" in n for n in result.notes)


def test_what_the_apiserver_wrote_is_not_carried_into_the_output() -> None:
    """`kubectl get deployment -o yaml` as the input (docs/migrating-from-multus.md): the
    output applies over the running object (no stale resourceVersion, no status)."""
    live = deployment("a")
    live["metadata"].update(
        resourceVersion="4711",
        uid="0b1c",
        generation=3,
        creationTimestamp="2026-11-27T00:00:00Z",
        managedFields=[{"manager": "kubectl"}],
        annotations={
            "deployment.kubernetes.io/revision": "3",
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
            "team": "kept",
        },
    )
    live["status"] = {"replicas": 1}
    result = run(nad("a", macvlan(POOLED)), live)
    assert not result.refused, result.refused
    [made] = [d for d in result.docs if d["kind"] == "Deployment"]
    assert "status" not in made
    assert made["metadata"] == {"name": "app", "namespace": "t", "annotations": {"team": "kept"}}


def test_whereabouts_network_names_keep_two_networks_of_one_range_apart() -> None:
    """whereabouts' network_name: two networks over one range, each its own IPPool
    (`<network>-<range>`) and reservations (`<network>-<address>`): each pool reserves only its
    network's."""
    red = {"type": "whereabouts", "range": "198.18.76.0/24", "network_name": "red"}
    blue = {"type": "whereabouts", "range": "198.18.76.0/24", "network_name": "blue"}
    red_pool = ippool("198.18.76.0/24", {"5": {"podref": "t/red-0"}})
    red_pool["metadata"]["name"] = "red-198.18.76.0-24"
    blue_pool = ippool("198.18.76.0/24", {"5": {"podref": "t/blue-0"}})
    blue_pool["metadata"]["name"] = "blue-198.18.76.0-24"
    result = run(
        nad("red", macvlan(red)),
        nad("blue", macvlan(blue, master="eth2")),
        deployment("red,blue"),
        red_pool,
        blue_pool,
        reservation("blue-198.18.76.9", "t/blue-1"),
    )
    assert not result.refused, result.refused
    pools = {d["metadata"]["name"]: d["spec"] for d in result.docs if d["kind"] == "CNIIPPool"}
    assert pools["t-red"]["reservations"] == [{"address": "198.18.76.5", "pod": "t/red-0"}]
    assert pools["t-blue"]["reservations"] == [
        {"address": "198.18.76.5", "pod": "t/blue-0"},
        {"address": "198.18.76.9", "pod": "t/blue-1"},
    ]


def test_what_cannot_be_reserved_is_said_with_its_pods() -> None:
    wb = {
        "type": "whereabouts",
        "range": "198.18.77.0/24",
        "gateway": "198.18.77.1",
        "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"},
        "log_file": "/tmp/whereabouts.log",
    }
    result = run(
        nad("a", macvlan(wb)),
        deployment("a"),
        ippool("198.18.77.0/24", {"1": {"podref": "t/on-gw"}, "9": {"podref": "t/db-5"}}),
        reservation("198.18.77.9", "t/db-0"),  # disagrees with the IPPool
    )
    assert not result.refused, result.refused
    [pool] = [d for d in result.docs if d["kind"] == "CNIIPPool"]
    assert "reservations" not in pool["spec"]
    assert pool["spec"]["exclude"] == ["198.18.77.9/32"]
    [said] = [n for n in result.notes if "whereabouts holds" in n or "can be reserved" in n]
    assert "198.18.77.9 (t/db-0 and t/db-5)" in said, said
    assert "198.18.77.1 (t/on-gw)" in said and "never hands out" in said, said
    assert any("kubernetes, log_file dropped" in n for n in result.notes), result.notes
    assert any('{"type": "cnidra", "pool": "t-a"}' in n for n in result.notes), result.notes


def test_one_nads_pool_serves_every_namespace_converted_with_it_in_one_run() -> None:
    """docs/migrating-from-multus.md, "Differences to know": one run, one pool of the NAD's
    name serving each namespace whose workloads use it."""
    wb = {"type": "whereabouts", "range": "198.18.78.0/24"}
    result = run(
        nad("mgmt", macvlan(wb), namespace="infra"),
        deployment("infra/mgmt", name="a", namespace="prod"),
        deployment("mgmt", name="b", namespace="infra"),
    )
    assert not result.refused, result.refused
    [pool] = [d for d in result.docs if d["kind"] == "CNIIPPool"]
    assert pool["metadata"]["name"] == "infra-mgmt"
    assert sorted(pool["spec"]["namespaces"]) == ["infra", "prod"]
