"""Claims read before kubelet asks (cnidra.dra.ahead, issue 42): a pod bound to the node has
its claims read and judged, and NodePrepareResources then prepares from what was read, with no
GET; a claim not read, stale or expired, or a watch that fails, falls back to the GET."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.refs import ObjectRef
from cnidra.dra.ahead import ClaimsAhead, ReadAhead, claim_names
from cnidra.dra.prepare import Preparer
from cnidra.kube.api import Transient
from cnidra.observe import metrics
from cnidra.state.checkpoint import Checkpoint
from cnidra.state.layout import StateLayout
from tests.dra.test_prepare import DIRS, VIEW, claim

REF = ObjectRef("ns", "c", "uid-1")


def stored(version: str = "7") -> dict[str, Any]:
    c = claim()
    c["metadata"].update(namespace="ns", name="c", resourceVersion=version)
    return c


def pod(uid: str = "pod-1", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": "p"},
        "spec": {"nodeName": "n1", "resourceClaims": [{"name": "net", "resourceClaimName": "c"}]},
        "status": status,
    }


class CountingClaims:
    """The apiserver's claims, every GET counted."""

    def __init__(self, *claims: dict[str, Any], fail: bool = False) -> None:
        self.claims = {c["metadata"]["name"]: c for c in claims}
        self.gets = 0
        self.sent = 0  # GETs sent (`gets`: answered), for the subclasses that hold them
        self.fail = fail

    async def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.gets += 1
        if self.fail:
            raise Transient(503, "the apiserver is away")
        found = self.claims.get(name)
        return copy.deepcopy(found) if found is not None else None


def watching(*events: tuple[str, dict[str, Any]], then: Exception | None = None) -> Any:
    async def watch() -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        for event in events:
            yield event
        if then is not None:
            raise then

    return watch


def preparer(tmp_path: Path, claims: CountingClaims, cache: ClaimsAhead | None) -> Preparer:
    p = Preparer("n1", claims, Checkpoint(StateLayout(tmp_path)), DIRS, view=lambda: VIEW)
    p.ahead = cache
    return p


async def read_ahead(p: Preparer, claims: CountingClaims, *events: tuple[str, Any]) -> ReadAhead:
    assert p.ahead is not None
    ahead = ReadAhead(watching(*events), claims, p.ahead, p.warm)
    await ahead.watch_once()
    await ahead.drained()
    return ahead


async def test_a_claim_read_when_its_pod_was_bound_is_prepared_with_no_get(
    tmp_path: Path,
) -> None:
    claims = CountingClaims(stored())
    p = preparer(tmp_path, claims, ClaimsAhead())
    await read_ahead(p, claims, ("ADDED", pod()), ("MODIFIED", pod(phase="Pending")))
    assert claims.gets == 1  # the pod's update does not read it again
    assert p.verdicts.misses > 0  # judged ahead: its verdicts are there
    misses = p.verdicts.misses
    claims.gets = 0
    prepared = await p.prepare(REF)
    assert claims.gets == 0 and prepared.uid == "uid-1" and prepared.devices
    assert p.verdicts.misses == misses  # prepare's judgement found every verdict ready
    assert p.ahead is not None and p.ahead.hits == 1


async def test_a_claim_judged_when_its_pod_was_bound_is_not_judged_again_on_the_same_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read-ahead keeps the claim's typed reading and its judgement with the view it was
    made on: prepare, on that same view, only leases addresses, names and checkpoints."""
    import cnidra.dra.prepare as prepare_module

    claims = CountingClaims(stored())
    p = preparer(tmp_path, claims, ClaimsAhead())
    await read_ahead(p, claims, ("ADDED", pod()))
    assert p.ahead is not None
    [entry] = p.ahead._entries.values()
    assert entry.judged is not None and entry.view is VIEW
    judged: list[object] = []
    real = prepare_module.resolve_claim
    monkeypatch.setattr(
        prepare_module, "resolve_claim", lambda *a, **k: judged.append(a) or real(*a, **k)
    )
    monkeypatch.setattr(prepare_module, "read", lambda *a: pytest.fail("read again"))
    claims.gets = 0
    used = metrics.CLAIMS_AHEAD_JUDGED.labels("used")._value.get()
    prepared = await p.prepare(REF)
    assert judged == [] and claims.gets == 0
    assert metrics.CLAIMS_AHEAD_JUDGED.labels("used")._value.get() == used + 1
    assert prepared.uid == "uid-1" and [d.if_name for d in prepared.devices] == ["net1"]


async def test_a_judgement_made_on_another_view_is_made_again(tmp_path: Path) -> None:
    """The node changed between the pod's binding and kubelet's call (a link, an address, a
    label): the view is another object, and prepare judges the claim on the node as it is
    then, exactly as one it fetched (from the typed reading kept: no GET)."""
    from dataclasses import replace

    views = [VIEW]
    claims = CountingClaims(stored())
    p = Preparer("n1", claims, Checkpoint(StateLayout(tmp_path)), DIRS, view=lambda: views[0])
    p.ahead = ClaimsAhead()
    await read_ahead(p, claims, ("ADDED", pod()))
    views[0] = replace(VIEW, links={})  # the claim's link is gone from the node
    claims.gets = 0
    again = metrics.CLAIMS_AHEAD_JUDGED.labels("again")._value.get()
    with pytest.raises(Exception, match="not a link or network of this node"):
        await p.prepare(REF)
    assert claims.gets == 0
    assert metrics.CLAIMS_AHEAD_JUDGED.labels("again")._value.get() == again + 1


async def test_a_claim_whose_judgement_reads_namespace_labels_is_judged_at_prepare(
    tmp_path: Path,
) -> None:
    """A named network that selects namespaces by label: the labels (and the network's node
    conf) are read when prepare judges, as they may change after the binding; such a claim
    keeps only its typed reading and verdicts from the read-ahead."""
    from cnidra.api.networks import NamedNetwork, cninetwork
    from cnidra.api.nodes import NodeView
    from tests.dra.test_prepare import DRIVER, Labels, Networks
    from tests.dra.test_prepare import claim as make_claim

    data = cninetwork(
        {
            "metadata": {"name": "data"},
            "spec": {
                "config": {"type": "macvlan", "ipam": {"type": "static"}},
                "namespaceSelector": {"matchLabels": {"tier": "data"}},
            },
        }
    )
    assert isinstance(data, NamedNetwork)
    view = NodeView(links={"net-data": "eth1"}, networks={"net-data": data})
    results = [{"request": "net", "driver": DRIVER, "pool": "n1", "device": "net-data"}]
    c = make_claim(configs=[], results=results)
    c["metadata"].update(namespace="ns", name="c", resourceVersion="7")
    labels = Labels({"tier": "data"})
    claims = CountingClaims(c)
    p = Preparer(
        "n1", claims, Checkpoint(StateLayout(tmp_path)), DIRS, view=lambda: view,
        namespaces=labels, networks=Networks(),
    )  # fmt: skip
    p.ahead = ClaimsAhead()
    await read_ahead(p, claims, ("ADDED", pod()))
    [entry] = p.ahead._entries.values()
    assert entry.typed is not None and entry.judged is None  # read and warmed, not judged
    labels.value = {}  # the namespace lost its label after the pod was bound
    claims.gets = 0
    with pytest.raises(Exception, match="namespaceSelector does not select ns"):
        await p.prepare(REF)
    assert claims.gets == 0


async def test_a_newer_resource_version_read_since_falls_back_to_the_get(tmp_path: Path) -> None:
    claims = CountingClaims(stored("7"))
    cache = ClaimsAhead()
    p = preparer(tmp_path, claims, cache)
    await read_ahead(p, claims, ("ADDED", pod()))
    cache.seen(stored("8"))  # the claim changed since, as another read of it told
    claims.gets = 0
    await p.prepare(REF)
    assert claims.gets == 1 and cache.stale == 1 and cache.hits == 0


async def test_an_expired_claim_falls_back_to_the_get(tmp_path: Path) -> None:
    now = [0.0]
    claims = CountingClaims(stored())
    cache = ClaimsAhead(ttl=10.0, clock=lambda: now[0])
    p = preparer(tmp_path, claims, cache)
    await read_ahead(p, claims, ("ADDED", pod()))
    now[0] = 11.0
    claims.gets = 0
    await p.prepare(REF)
    assert claims.gets == 1 and cache.stale == 1


async def test_a_claim_not_seen_falls_back_to_the_get(tmp_path: Path) -> None:
    claims = CountingClaims(stored())
    p = preparer(tmp_path, claims, ClaimsAhead())
    prepared = await p.prepare(REF)
    assert claims.gets == 1 and prepared.uid == "uid-1"
    assert p.ahead is not None and p.ahead.misses == 1


async def test_another_uid_of_the_same_name_is_not_taken(tmp_path: Path) -> None:
    claims = CountingClaims(stored())
    p = preparer(tmp_path, claims, ClaimsAhead())
    await read_ahead(p, claims, ("ADDED", pod()))
    recreated = stored()
    recreated["metadata"]["uid"] = "uid-2"
    claims.claims["c"] = recreated
    claims.gets = 0
    with pytest.raises(Exception, match="UID"):
        await p.prepare(ObjectRef("ns", "c", "uid-1-other"))
    assert claims.gets == 1  # kubelet's UID is not the one read ahead: asked again


async def test_a_claim_not_yet_reserved_for_the_pod_is_not_kept(tmp_path: Path) -> None:
    claims = CountingClaims(stored())
    p = preparer(tmp_path, claims, ClaimsAhead())
    await read_ahead(p, claims, ("ADDED", pod(uid="another-pod")))
    assert p.ahead is not None and len(p.ahead) == 0


async def test_a_failing_watch_degrades_to_the_get(tmp_path: Path) -> None:
    claims = CountingClaims(stored())
    cache = ClaimsAhead()
    p = preparer(tmp_path, claims, cache)
    ahead = ReadAhead(watching(then=Transient(503, "watch refused")), claims, cache, p.warm)
    with pytest.raises(Transient):
        await ahead.watch_once()
    await p.prepare(REF)
    assert claims.gets == 1 and len(cache) == 0


async def test_a_read_that_fails_leaves_the_claim_to_the_get(tmp_path: Path) -> None:
    away = CountingClaims(stored(), fail=True)
    claims = CountingClaims(stored())
    cache = ClaimsAhead()
    p = preparer(tmp_path, claims, cache)
    ahead = ReadAhead(watching(("ADDED", pod())), away, cache, p.warm)
    await ahead.watch_once()
    await ahead.drained()
    assert ahead.failed == 1 and len(cache) == 0
    await p.prepare(REF)
    assert claims.gets == 1


def test_a_stale_claim_leaves_nothing_behind() -> None:
    now = [0.0]
    cache = ClaimsAhead(ttl=1.0, clock=lambda: now[0])
    for i in range(50):
        c = stored()
        c["metadata"].update(name=f"c{i}", uid=f"u{i}")
        cache.put(c)
        now[0] += 2.0
        assert cache.ready(ObjectRef("ns", f"c{i}", f"u{i}")) is None
    assert len(cache) == 0 and not cache._uids


def test_the_cache_is_bounded() -> None:
    cache = ClaimsAhead(size=3)
    for i in range(10):
        c = stored()
        c["metadata"].update(name=f"c{i}", uid=f"u{i}")
        assert cache.put(c)
    assert len(cache) == 3
    assert cache.ready(ObjectRef("ns", "c9", "u9")) is not None
    assert cache.ready(ObjectRef("ns", "c0", "u0")) is None


def test_versions_are_remembered_only_for_the_claims_kept() -> None:
    """prepare tells the cache of every claim it GETs (`seen`): a claim not kept is not
    remembered (1,000 prepared claims held 0.1 MiB of versions no one read), and the reads of
    many others never make a kept one look stale."""
    cache = ClaimsAhead(size=2)
    assert cache.put(stored())
    for i in range(20):
        c = stored("9")
        c["metadata"].update(name=f"other{i}", uid=f"other-{i}")
        cache.seen(c)
    assert set(cache._newest) == {"uid-1"}
    assert cache.ready(REF) is not None and cache.hits == 1
    assert not cache._newest  # used: forgotten with its entry
    cache.seen(stored("8"))  # read again after it was used: nothing kept to be stale
    assert not cache._newest


def test_a_kept_claim_is_used_once_and_without_its_managed_fields() -> None:
    """bench.fleet measured 13.3 KB a kept claim, 41 % of it managedFields, which prepare never
    reads; kubelet prepares a claim once, so a hit frees its entry."""
    cache = ClaimsAhead()
    c = stored()
    c["metadata"].update(uid="uid-1", managedFields=[{"manager": "kube-scheduler"}] * 20)
    assert cache.put(c)
    ahead = cache.ready(REF)
    assert ahead is not None
    got = ahead.claim
    assert "managedFields" not in got["metadata"]
    assert got["metadata"]["resourceVersion"] == "7" and got["status"] == c["status"]
    assert "managedFields" in c["metadata"]  # the caller's object untouched
    assert len(cache) == 0 and not cache._uids
    assert cache.ready(REF) is None  # a second prepare GETs


def test_expired_claims_are_swept_when_others_are_kept() -> None:
    """A pod whose claim was read but never prepared here (deleted first) does not hold its
    entry until the bound pushes it out."""
    now = [0.0]
    cache = ClaimsAhead(ttl=1.0, clock=lambda: now[0])
    for i in range(10):
        c = stored()
        c["metadata"].update(name=f"c{i}", uid=f"u{i}")
        cache.put(c)
    now[0] += 2.0
    c = stored()
    c["metadata"].update(name="fresh", uid="u-fresh")
    cache.put(c)
    assert len(cache) == 1 and set(cache._uids) == {("ns", "fresh")}


async def test_pending_reads_are_bounded() -> None:
    gate = asyncio.Event()

    class Slow(CountingClaims):
        async def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
            await gate.wait()
            return await super().get(namespace, name)

    claims = Slow(stored())
    ahead = ReadAhead(watching(), claims, ClaimsAhead(), max_pending=2)
    for i in range(5):
        ahead.on_pod("ADDED", pod(uid=f"pod-{i}"))
    assert ahead.skipped == 3
    gate.set()
    await ahead.drained()
    assert claims.gets == 2


def test_a_pods_claims_come_from_its_spec_and_its_status() -> None:
    p = pod()
    p["spec"]["resourceClaims"].append({"name": "t", "resourceClaimTemplateName": "tmpl"})
    p["status"] = {"resourceClaimStatuses": [{"name": "t", "resourceClaimName": "p-t-x1"}]}
    assert claim_names(p) == ["c", "p-t-x1"]
    assert claim_names({"spec": {"resourceClaims": "bad"}, "status": None}) == []


async def test_the_watch_is_started_again_on_the_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    starts = 0
    slept: list[float] = []

    async def watch() -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
        nonlocal starts
        starts += 1
        raise Transient(503, "watch refused")
        yield  # an async generator

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            raise asyncio.CancelledError

    monkeypatch.setattr("cnidra.dra.ahead.asyncio.sleep", sleep)
    ahead = ReadAhead(watch, CountingClaims(), ClaimsAhead())
    with pytest.raises(asyncio.CancelledError):
        await ahead.run()
    assert starts == 3 and ahead.watch_failures == 3
    assert slept[0] < slept[1] < slept[2]  # the one backoff's growing pace


async def test_the_claims_of_pods_running_or_going_are_not_read() -> None:
    claims = CountingClaims(stored())
    ahead = ReadAhead(watching(), claims, ClaimsAhead())
    ahead.on_pod("ADDED", pod(uid="running", phase="Running"))
    ahead.on_pod("ADDED", pod(uid="done", phase="Succeeded"))
    going = pod(uid="going")
    going["metadata"]["deletionTimestamp"] = "2026-11-27T06:00:00Z"
    ahead.on_pod("MODIFIED", going)
    await ahead.drained()
    assert claims.gets == 0


async def test_the_pods_read_are_remembered_within_bounds_and_forgotten_when_deleted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deleted pod's keys go by its UID (not by scanning every pod remembered), and the
    oldest pods remembered give way past SEEN_PODS, their index with them."""
    from cnidra.dra import ahead as ahead_module

    monkeypatch.setattr(ahead_module, "SEEN_PODS", 3)
    reader = ReadAhead(watching(), CountingClaims(stored()), ClaimsAhead())
    for i in range(5):
        reader.on_pod("ADDED", pod(f"pod-{i}"))
    await reader.drained()
    assert [uid for uid, _ in reader._read] == ["pod-2", "pod-3", "pod-4"]
    assert set(reader._read_of) == {"pod-2", "pod-3", "pod-4"}
    reader.on_pod("DELETED", pod("pod-3"))
    assert [uid for uid, _ in reader._read] == ["pod-2", "pod-4"]
    assert set(reader._read_of) == {"pod-2", "pod-4"}
    reader.on_pod("ADDED", pod("pod-3"))  # bound again (a new pod of that UID is not): read
    await reader.drained()
    assert reader.reads == 6


def test_the_nodes_addresses_are_parsed_once_for_its_facts() -> None:
    from cnidra.api.hostside import LinkFacts, NodeFacts

    facts = NodeFacts({"eth1": LinkFacts("eth1", "physical", 1500, ("198.18.0.1/24", "bad"))})
    first = facts.addresses()
    assert {str(a) for a in first} == {"198.18.0.1"}
    assert facts.addresses() is first


async def test_prepare_waits_for_a_read_ahead_under_way_rather_than_get_the_claim_twice(
    tmp_path: Path,
) -> None:
    """A loaded node: kubelet asks while the read ahead's GET is still out. Prepare waits for
    that read (and its judgement) and takes the claim from it: one GET in all."""
    gate = asyncio.Event()

    class Slow(CountingClaims):
        async def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
            self.sent += 1
            await gate.wait()
            return await super().get(namespace, name)

    claims = Slow(stored())
    p = preparer(tmp_path, claims, ClaimsAhead())
    assert p.ahead is not None
    ahead = ReadAhead(watching(), claims, p.ahead, p.warm)
    ahead.on_pod("ADDED", pod())
    await asyncio.sleep(0)  # the read took its slot and sent its GET
    assert p.ahead.reading("ns", "c") is not None
    waited = metrics.CLAIMS_AHEAD_WAITED._value.get()
    preparing = asyncio.create_task(p.prepare(REF))
    await asyncio.sleep(0.01)
    assert not preparing.done() and claims.sent == 1  # waiting, not GETting
    gate.set()
    prepared = await preparing
    assert prepared.uid == "uid-1" and claims.sent == 1
    assert p.ahead.hits == 1 and metrics.CLAIMS_AHEAD_WAITED._value.get() == waited + 1
    assert p.ahead.reading("ns", "c") is None


async def test_a_read_ahead_still_queued_when_prepare_gets_the_claim_is_not_made(
    tmp_path: Path,
) -> None:
    """Reads wait for a slot (DEFAULT_READS at once): one whose claim prepare read itself
    meanwhile is dropped, not made after it, and the claim is read ahead again for the next
    pod bound to it."""
    gate = asyncio.Event()

    class Slow(CountingClaims):
        async def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
            self.sent += 1
            if name == "other":
                await gate.wait()
            return await super().get(namespace, name)

    other = stored()
    other["metadata"].update(name="other", uid="uid-other")
    claims = Slow(stored(), other)
    p = preparer(tmp_path, claims, ClaimsAhead())
    assert p.ahead is not None
    ahead = ReadAhead(watching(), claims, p.ahead, p.warm, max_reads=1)
    blocker = pod(uid="pod-0")
    blocker["spec"]["resourceClaims"] = [{"name": "net", "resourceClaimName": "other"}]
    ahead.on_pod("ADDED", blocker)  # holds the one slot
    ahead.on_pod("ADDED", pod())  # its read of c waits for the slot
    await asyncio.sleep(0)
    prepared = await p.prepare(REF)  # kubelet first: prepare GETs c
    assert prepared.uid == "uid-1" and claims.sent == 2
    gate.set()
    await ahead.drained()
    assert claims.sent == 2 and ahead.late == 1  # c was not read again
    ahead.on_pod("ADDED", pod(uid="pod-2"))  # another pod bound to c: read ahead again
    await ahead.drained()
    assert claims.sent == 3
