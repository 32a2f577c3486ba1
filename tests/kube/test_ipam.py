"""cnidra.kube.ipam against a fake client (the session's methods, on dicts): what the
apiserver's answers mean, and which are asked again (transient answers, to the calls that may be
repeated)."""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

from cnidra.api.ipam import IPAMCLAIM_FINALIZER, Block
from cnidra.ipam.allocator import IPAMCluster
from cnidra.kube.api import Node, RefusedForGood, Transient
from cnidra.kube.ipam import CNIIPBlock, CNIIPPool, IPAMClaim, KubeIPAM, _block_object
from cnidra.kube.session import ApiStatus

BLOCK = Block("data", 0, 1, ipaddress.ip_network("198.18.130.16/28"))


class Client:
    """A block that exists already (made by `holder`), or none."""

    def __init__(self, holder: str | None) -> None:
        self.holder = holder

    async def get(self, resource: Any, name: str, **_: Any) -> Any:
        if resource == Node:
            return {"metadata": {"name": name, "uid": f"uid-{name}"}}
        if self.holder is None:
            raise ApiStatus(404, "not found")
        return {
            "metadata": {
                "name": name,
                "uid": "block-uid",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": self.holder, "uid": "u"}
                ],
            },
            "spec": {"pool": "data", "range": 0, "cidr": str(BLOCK.cidr), "node": self.holder},
        }

    async def create(self, kind: Any, obj: Any, **_: Any) -> Any:
        raise ApiStatus(409, "already exists")


@pytest.mark.parametrize(
    ("holder", "expected"), [("a", "block-uid"), ("b", None), (None, None)]
)  # fmt: skip
async def test_a_block_that_exists_is_this_nodes_only_if_it_says_so(
    holder: str | None, expected: str | None
) -> None:
    """A create retried after its answer was lost (issue 27: transient answers are asked
    again) meets its own block: that is this node's reservation, not another node's."""
    ipam = KubeIPAM(Client(holder))  # type: ignore[arg-type]
    assert await ipam.create_block(BLOCK, "a") == expected


# ------------------------------------------------------------------ transient answers

HELD = Block("data", 0, 2, ipaddress.ip_network("198.18.130.32/28"))
HANG = "hang"  # no answer: the call's own timeout ends the attempt
Failure = BaseException | str


def _block(block: Block, node: str, uid: str) -> Any:
    owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": f"uid-{node}"}
    return {
        "metadata": {
            "name": block.name,
            "uid": uid,
            "resourceVersion": "1",
            "ownerReferences": [owner],
        },
        "spec": {
            "pool": block.pool,
            "range": block.range_index,
            "cidr": str(block.cidr),
            "node": node,
        },
    }


def _claim(finalizers: list[str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "keep",
        "namespace": "ns",
        "uid": "claim-uid",
        "resourceVersion": "1",
    }
    if finalizers is not None:
        meta["finalizers"] = finalizers
    return {"metadata": meta, "spec": {"network": "data", "interface": "net1"}}


class Apiserver:
    """The session's methods over an apiserver holding pool `data`, IPAMClaim ns/keep, every
    Node it is asked about and block HELD (node a's), that first gives each of `failures`,
    one a request; `lose_create` loses the answer of the first CREATE that went through."""

    def __init__(self, failures: Sequence[Failure] = (), lose_create: bool = False) -> None:
        self.failures = list(failures)
        self.lose_create = lose_create
        self.requests: list[str] = []
        self.blocks: dict[str, Any] = {HELD.name: _block(HELD, "a", "held-uid")}

    async def _answer(self, what: str) -> None:
        self.requests.append(what)
        if self.failures:
            failure = self.failures.pop(0)
            if failure == HANG:
                await asyncio.Event().wait()
            assert isinstance(failure, BaseException)
            raise failure

    async def get(self, resource: Any, name: str, **_: Any) -> Any:
        await self._answer(f"get {resource.kind} {name}")
        if resource == Node:
            return {"metadata": {"name": name, "uid": f"uid-{name}"}}
        if resource == CNIIPPool:
            return {"metadata": {"name": name}, "spec": {"blockSize": 16}}
        if resource == IPAMClaim:
            return _claim()
        if name not in self.blocks:
            raise ApiStatus(404, "not found")
        return self.blocks[name]

    def list(self, resource: Any, **_: Any) -> AsyncIterator[Any]:
        async def answer() -> AsyncIterator[Any]:
            await self._answer(f"list {resource.kind}")
            if resource == CNIIPBlock:
                for obj in list(self.blocks.values()):
                    yield obj
            elif resource == IPAMClaim:
                yield _claim([IPAMCLAIM_FINALIZER])
            elif resource == CNIIPPool:
                yield {"metadata": {"name": "data"}, "spec": {"blockSize": 16}}

        return answer()

    async def create(self, kind: Any, obj: Any, **_: Any) -> Any:
        name = obj["metadata"].get("name") or obj["metadata"].get("generateName")
        await self._answer(f"create {kind.kind} {name}")
        if kind == CNIIPBlock:
            if name in self.blocks:
                raise ApiStatus(409, "already exists")
            obj = {**obj, "metadata": {**obj["metadata"], "uid": f"uid-of-{name}"}}
            self.blocks[name] = obj
            if self.lose_create:
                self.lose_create = False
                raise TimeoutError("the answer was lost")
        return obj

    async def delete(self, resource: Any, name: str, **_: Any) -> None:
        await self._answer(f"delete {resource.kind} {name}")
        if self.blocks.pop(name, None) is None:
            raise ApiStatus(404, "not found")

    async def patch(self, resource: Any, name: str, obj: Any, **_: Any) -> Any:
        await self._answer(f"patch {resource.kind} {name}")
        return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "2"}}


Call = Callable[[KubeIPAM], Awaitable[Any]]
# every call of IPAMCluster that may be repeated: asked again after a transient answer
RETRIED: dict[str, Call] = {
    "pool": lambda ipam: ipam.pool("data"),
    "pools": lambda ipam: ipam.pools(),
    "blocks": lambda ipam: ipam.blocks(pool="data"),
    "create_block": lambda ipam: ipam.create_block(BLOCK, "a"),
    "delete_block": lambda ipam: ipam.delete_block(HELD.name, "held-uid"),
    "ipamclaim": lambda ipam: ipam.ipamclaim("ns", "keep"),
    "bound_ipamclaims": lambda ipam: ipam.bound_ipamclaims(),
}
# the others, and why a transient answer reaches the caller at once
NOT_RETRIED: dict[str, tuple[str, Call]] = {
    "bind_ipamclaim": (
        "PATCHes with a resourceVersion precondition: sent again after a lost answer they meet "
        "their own write (409, 'changed since read'); the allocator reads the claim again",
        lambda ipam: ipam.bind_ipamclaim(_claim(), ["198.18.130.20/24"], "pod", "a"),
    ),
    "own_block": (
        "a PATCH with a resourceVersion precondition, at start-up; the reconciler's next pass "
        "syncs again",
        lambda ipam: ipam.own_block(_block_object(_block(HELD, "a", "held-uid")), "a"),
    ),
    "unbind_ipamclaim": (
        "a JSON patch testing the finalizers as read: sent again after a lost answer its test "
        "fails; the reconciler's next pass asks again",
        lambda ipam: ipam.unbind_ipamclaim(_claim([IPAMCLAIM_FINALIZER])),
    ),
    "node_exists": (
        "the reconciler's (lost nodes), whose next pass asks again",
        lambda ipam: ipam.node_exists("b"),
    ),
    "addresses_in_use": (
        "the reconciler's (deleted IPAMClaims), whose next pass asks again",
        lambda ipam: ipam.addresses_in_use("ns"),
    ),
    "record": (
        "an Event's create (generateName): sent again after a lost answer it is written twice",
        lambda ipam: ipam.record(_claim(), "AddressesKept", "kept"),
    ),
}
PROTOCOL = sorted(n for n, v in vars(IPAMCluster).items() if inspect.iscoroutinefunction(v))
TRANSIENT: dict[str, Failure] = {
    "storage initializing": ApiStatus(500, "storage is (re)initializing"),
    "throttled": ApiStatus(429, "TooManyRequests"),
    "throttled, Retry-After": ApiStatus(429, "TooManyRequests", 2.0),
    "no answer in time": HANG,
}
FORBIDDEN = ApiStatus(403, "forbidden")


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits between tries, not waited."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return waits


@pytest.mark.parametrize("method", PROTOCOL)
def test_every_call_of_the_ipam_cluster_is_retried_or_says_why_not(method: str) -> None:
    assert (method in RETRIED) != (method in NOT_RETRIED), (
        f"IPAMCluster.{method}: add it to RETRIED (it may be repeated) or to NOT_RETRIED, "
        "with the reason"
    )
    assert set(RETRIED) | set(NOT_RETRIED) <= set(PROTOCOL)


@pytest.mark.parametrize("answer", TRANSIENT)
@pytest.mark.parametrize("method", RETRIED)
async def test_a_call_that_may_be_repeated_is_asked_again_after_transient_answers(
    method: str, answer: str, slept: list[float]
) -> None:
    """Issue 27: the pool GET, the block LIST, the IPAMClaims, the block CREATE and the
    IPAMClaim GET each met "storage is (re)initializing" once in a while; the allocator never
    sees such an answer, nor a try that got no answer in time (each try has its own timeout)."""
    clean = Apiserver()
    expected = await RETRIED[method](KubeIPAM(clean, timeout=0.01))  # type: ignore[arg-type]
    flaky = Apiserver([TRANSIENT[answer]] * 2)
    got = await RETRIED[method](KubeIPAM(flaky, timeout=0.01))  # type: ignore[arg-type]
    assert got == expected
    assert flaky.requests == clean.requests[:1] * 2 + clean.requests  # asked twice more
    if answer == "throttled, Retry-After":
        assert slept == [2.0, 2.0]  # as the apiserver asked
    else:
        assert len(slept) == 2 and all(0 < s <= 0.6 for s in slept), slept


@pytest.mark.parametrize("method", RETRIED)
async def test_a_call_that_may_be_repeated_gives_up_on_a_lasting_transient_answer(
    method: str, slept: list[float]
) -> None:
    flaky = Apiserver([TRANSIENT["storage initializing"]] * 10)
    with pytest.raises(Transient, match="storage is"):
        await RETRIED[method](KubeIPAM(flaky))  # type: ignore[arg-type]
    assert len(flaky.requests) == 4 and len(slept) == 3  # with_retries' bound


@pytest.mark.parametrize("method", RETRIED)
async def test_an_answer_that_is_not_transient_is_raised_at_once(
    method: str, slept: list[float]
) -> None:
    refusing = Apiserver([FORBIDDEN])
    with pytest.raises(RefusedForGood, match="forbidden"):
        await RETRIED[method](KubeIPAM(refusing))  # type: ignore[arg-type]
    assert len(refusing.requests) == 1 and slept == []


@pytest.mark.parametrize("method", NOT_RETRIED)
async def test_a_call_that_may_not_be_repeated_raises_a_transient_answer_at_once(
    method: str, slept: list[float]
) -> None:
    _, call = NOT_RETRIED[method]
    flaky = Apiserver([TRANSIENT["storage initializing"]])
    with pytest.raises(Transient, match="storage is"):
        await call(KubeIPAM(flaky))  # type: ignore[arg-type]
    assert len(flaky.requests) == 1 and slept == []


async def test_a_block_create_whose_answer_was_lost_is_this_nodes_block(
    slept: list[float],
) -> None:
    """The CREATE went through but its answer was lost: sent again it meets its own block
    (409), which is this node's reservation, neither leaked nor skipped as another node's."""
    api = Apiserver(lose_create=True)
    uid = await KubeIPAM(api).create_block(BLOCK, "a")  # type: ignore[arg-type]
    assert uid == f"uid-of-{BLOCK.name}" and len(slept) == 1
    assert api.requests == [
        "get Node a",
        f"create CNIIPBlock {BLOCK.name}",
        f"create CNIIPBlock {BLOCK.name}",
        f"get CNIIPBlock {BLOCK.name}",
    ]
