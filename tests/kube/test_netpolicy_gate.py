"""Network policy's watch of every pod (and of namespaces) runs only while a policy exists
(cnidra.kube.netpolicy.PolicyGate, issue 42: the costliest watch a node holds, which nothing
reads without a policy): without one the enforcer is told there are no pods and namespaces, so
it is synced; a first policy is held back until both are listed, so it is never judged against
pods not known yet; the watches stop a while after the last policy goes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from cnidra.kube import netpolicy as watches
from cnidra.kube.api import Api
from cnidra.kube.netpolicy import PolicyGate


def obj(name: str, namespace: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}}


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, ...]] = []

    def replace(self, kind: str, objects: Any) -> None:
        self.seen.append(("replace", kind, *sorted(o["metadata"]["name"] for o in objects)))

    def changed(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        self.seen.append((event, kind, obj["metadata"]["name"]))


def test_without_a_policy_the_feed_is_told_there_are_no_pods_once_both_kinds_are_listed() -> None:
    feed = Recorder()
    gate = PolicyGate(feed)
    gate.replace("MultiNetworkPolicy", [])
    assert feed.seen == []  # the other kind of policy is not listed yet
    gate.replace("CNINetwork", [obj("n")])
    assert feed.seen == []  # held, in order, until the gate opens
    gate.replace("CNIAdminNetworkPolicy", [])
    assert feed.seen == [
        ("replace", "Namespace"),
        ("replace", "Pod"),
        ("replace", "MultiNetworkPolicy"),
        ("replace", "CNINetwork", "n"),
        ("replace", "CNIAdminNetworkPolicy"),
    ]
    assert not gate.wanted.is_set()


def test_a_first_policy_waits_for_the_pods_and_namespaces_and_nothing_is_lost() -> None:
    feed = Recorder()
    gate = PolicyGate(feed)
    gate.replace("MultiNetworkPolicy", [])
    gate.replace("CNIAdminNetworkPolicy", [])
    feed.seen.clear()
    gate.changed("MultiNetworkPolicy", "ADDED", obj("deny"))
    assert gate.wanted.is_set() and feed.seen == []  # held: the pods are not known
    gate.replace("Pod", [obj("a"), obj("b")])
    gate.changed("Pod", "ADDED", obj("c"))  # after its list, before the namespaces'
    gate.changed("MultiNetworkPolicy", "ADDED", obj("allow"))
    assert feed.seen == []
    gate.replace("Namespace", [obj("ns", "")])
    assert feed.seen == [
        ("replace", "Namespace", "ns"),
        ("replace", "Pod", "a", "b"),
        ("ADDED", "MultiNetworkPolicy", "deny"),
        ("ADDED", "Pod", "c"),
        ("ADDED", "MultiNetworkPolicy", "allow"),
    ]
    gate.changed("Pod", "DELETED", obj("a"))  # open: passes at once
    assert feed.seen[-1] == ("DELETED", "Pod", "a")


def test_policies_at_start_are_held_until_the_pods_are_listed() -> None:
    feed = Recorder()
    gate = PolicyGate(feed)
    gate.replace("MultiNetworkPolicy", [obj("p")])
    gate.replace("CNIAdminNetworkPolicy", [])
    assert gate.wanted.is_set() and feed.seen == []
    gate.replace("Namespace", [])
    gate.replace("Pod", [obj("a")])
    assert feed.seen == [
        ("replace", "Namespace"),
        ("replace", "Pod", "a"),
        ("replace", "MultiNetworkPolicy", "p"),
        ("replace", "CNIAdminNetworkPolicy"),
    ]


def test_when_the_watches_stop_the_feed_is_told_there_are_none_unless_a_policy_came() -> None:
    feed = Recorder()
    gate = PolicyGate(feed)
    gate.replace("MultiNetworkPolicy", [obj("p")])
    gate.replace("CNIAdminNetworkPolicy", [])
    gate.replace("Namespace", [])
    gate.replace("Pod", [obj("a")])
    gate.changed("MultiNetworkPolicy", "DELETED", obj("p"))
    feed.seen.clear()
    gate.closed()
    assert feed.seen == [("replace", "Namespace"), ("replace", "Pod")]
    assert not gate.wanted.is_set()
    gate.changed("CNIAdminNetworkPolicy", "ADDED", obj("admin", ""))  # held again
    assert gate.wanted.is_set() and feed.seen[-1] == ("replace", "Pod")
    # a policy that comes as the watches stop: they are followed again, the feed keeps them
    gate.replace("Namespace", [])
    gate.replace("Pod", [obj("b")])
    feed.seen.clear()
    gate.closed()
    assert feed.seen == [] and gate.wanted.is_set()


class KindClient:
    """The session's AsyncClient as Api calls it, per kind: its list, then its watch's events
    from a queue (one that is never fed blocks, as a quiet watch does)."""

    def __init__(self, listed: dict[str, list[Any]]) -> None:
        self.kinds = {resource: kind for kind, (resource, _) in watches.RESOURCES.items()}
        self.listed = listed
        self.events: dict[str, asyncio.Queue[tuple[str, Any]]] = {
            k: asyncio.Queue() for k in watches.RESOURCES
        }
        self.asked: list[tuple[str, str]] = []
        self.watching: set[str] = set()

    async def list(self, kind: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self.asked.append(("list", self.kinds[kind]))
        for o in self.listed.get(self.kinds[kind], []):
            yield o

    async def watch(self, kind: Any, **kwargs: Any) -> AsyncIterator[tuple[str, Any]]:
        name = self.kinds[kind]
        self.asked.append(("watch", name))
        self.watching.add(name)
        try:
            while True:
                yield await self.events[name].get()
        finally:
            self.watching.discard(name)


async def until(check: Any) -> None:
    for _ in range(3000):  # 30 s at most: a hang, not a slow machine
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never")


async def test_pods_are_watched_only_while_a_policy_exists() -> None:
    client = KindClient({"Pod": [obj("a")], "Namespace": [obj("ns", "")]})
    feed = Recorder()
    task = asyncio.create_task(watches.follow_all(Api(client), feed, idle=0.2))  # type: ignore[arg-type]
    try:
        await until(lambda: ("replace", "Pod") in feed.seen)  # none: the enforcer is synced
        assert ("list", "Pod") not in client.asked and ("list", "Namespace") not in client.asked
        client.events["MultiNetworkPolicy"].put_nowait(("ADDED", obj("deny")))
        await until(lambda: ("ADDED", "MultiNetworkPolicy", "deny") in feed.seen)
        assert feed.seen.index(("replace", "Pod", "a")) < feed.seen.index(
            ("ADDED", "MultiNetworkPolicy", "deny")
        )
        await until(lambda: client.watching >= {"Pod", "Namespace"})
        client.events["MultiNetworkPolicy"].put_nowait(("DELETED", obj("deny")))
        await until(lambda: not client.watching & {"Pod", "Namespace"})  # after `idle`
        assert feed.seen[-2:] == [("replace", "Namespace"), ("replace", "Pod")]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
