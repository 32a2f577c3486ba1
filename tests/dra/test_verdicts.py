"""Prepare's verdict cache (cnidra.dra.verdicts.VerdictCache): the verdict on a config judged
before is the verdict judging it again would give, issues included; any difference in what is
judged is judged anew; tenants cannot grow it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from cnidra.api.issues import Issues
from cnidra.api.networks import StaticCatalog
from cnidra.api.refs import ObjectRef
from cnidra.api.verdict import check_request
from cnidra.dra.claim import ALLOCATION_CONFIG, read_claim
from cnidra.dra.prepare import PrepareError, Preparer, SharedNetworks, resolve_claim
from cnidra.dra.verdicts import VerdictCache
from cnidra.state.checkpoint import Checkpoint
from cnidra.state.layout import StateLayout
from tests.dra.test_prepare import DIRS, REF, VIEW, Claims, Labels, claim
from tests.dra.test_prepare import params as l2_params


def params(**extra: Any) -> dict[str, Any]:
    """The claim's network with an address (a tenant's static one: host-local by a claim is
    refused), so the class's ipRanges judge it."""
    p = l2_params(**extra)
    p["config"]["plugins"][0]["ipam"] = {
        "type": "static",
        "addresses": [{"address": "198.18.0.5/24"}],
    }
    return p


RANGE = {"subnet": "198.18.0.0/24"}


def with_params(parameters: dict[str, Any], name: str = "c", uid: str = "uid-1") -> dict[str, Any]:
    c = claim(
        [
            {
                "source": "FromClaim",
                "requests": ["net"],
                "opaque": {"driver": "cni.dra.networking.x-k8s.io", "parameters": parameters},
            }
        ]
    )
    c["metadata"].update(name=name, uid=uid)
    return c


def judged(cache: VerdictCache | None, parameters: dict[str, Any]) -> tuple[Any, list[str]]:
    entries = read_claim(with_params(parameters)).configs
    issues = Issues()
    judge = cache.check_request if cache is not None else check_request
    resolved = judge(entries, "net", "ns", None, issues, ALLOCATION_CONFIG)
    return resolved, [str(i) for i in issues.items]


def subnet(text: str) -> dict[str, Any]:
    p = params()
    p["config"]["plugins"][0]["ipam"]["addresses"] = [{"address": text}]
    return p


def test_a_config_judged_again_gets_the_same_verdict_from_the_cache() -> None:
    cache = VerdictCache()
    first, told = judged(cache, params())
    again, told_again = judged(cache, params())
    assert (cache.misses, cache.hits) == (1, 1)
    assert again == first == judged(None, params())[0]
    assert again is not first  # a copy: a caller setting its attributes changes no other's
    assert told_again == told


def test_a_refused_config_is_refused_again_with_every_reason() -> None:
    cache = VerdictCache()
    bad = subnet("10.0.0.5/24")  # outside the class's ipRanges
    assert judged(cache, bad) == judged(cache, bad) == judged(None, bad)
    resolved, told = judged(cache, bad)
    assert resolved is None and any("outside the ranges" in t for t in told)
    assert cache.hits == 2


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["config"]["plugins"][0]["ipam"]["addresses"][0].update(address="10.1.0.5/24"),
        lambda p: p["config"]["plugins"][0].update(mode="passthru"),  # exclusive: refused
        lambda p: p["config"]["plugins"][0].update(Mode="bridge"),  # a spelling Go folds
        lambda p: p["config"]["plugins"][0]["ipam"].update(dataDir="/tmp"),
    ],
)
def test_a_different_config_is_judged_anew(change: Any) -> None:
    """A valid config in the cache never answers for one that differs from it, however
    little: each of these is refused, after the valid one was cached."""
    cache = VerdictCache()
    assert judged(cache, params())[0] is not None
    other = params()
    change(other)
    resolved, told = judged(cache, other)
    assert (resolved, told) == judged(None, other)
    assert resolved is None and told and cache.misses == 2


def test_key_order_and_value_types_are_part_of_the_content() -> None:
    """The plugins get the config's bytes as written: a config with its keys in another order
    is another config; 1 is not True is not 1.0."""
    cache = VerdictCache()
    judged(cache, params())
    reordered = params()
    plugin = reordered["config"]["plugins"][0]
    reordered["config"]["plugins"][0] = dict(reversed(list(plugin.items())))
    resolved, _ = judged(cache, reordered)
    assert resolved is not None and cache.misses == 2
    assert list(resolved.config.config["plugins"][0]) == list(reversed(list(plugin)))
    for mtu in (1500, True, 1500.0):
        p = params()
        p["config"]["plugins"][0]["mtu"] = mtu
        assert judged(cache, p) == judged(None, p)
    assert cache.misses == 5


def test_namespace_and_labels_are_part_of_the_key() -> None:
    cache = VerdictCache()
    entries = read_claim(with_params(params())).configs
    for namespace, labels in (("ns", None), ("other", None), ("ns", {}), ("ns", {"a": "b"})):
        cache.check_request(entries, "net", namespace, labels, Issues(), ALLOCATION_CONFIG)
    assert (cache.misses, cache.hits) == (4, 0)


def test_tenants_cannot_grow_the_cache() -> None:
    cache = VerdictCache(size=8)
    for i in range(40):
        judged(cache, subnet(f"198.18.{i}.5/24"))
    assert len(cache) == 8
    judged(cache, subnet("198.18.39.5/24"))  # the most recent are kept
    judged(cache, subnet("198.18.0.5/24"))  # the oldest went
    assert cache.hits == 1 and cache.misses == 41


def test_a_config_too_large_to_keep_is_judged_every_time() -> None:
    cache = VerdictCache(max_key_chars=2048)
    big = params(args={f"K{i}": "v" * 40 for i in range(60)})
    first, _ = judged(cache, big)
    assert judged(cache, big)[0] == first
    assert len(cache) == 0 and cache.hits == 0


def test_a_request_naming_networks_is_never_cached() -> None:
    """Named networks are read afresh at each prepare: their verdict is not kept."""
    cache = VerdictCache()
    entries = read_claim(with_params(params())).configs
    for _ in range(2):
        cache.check_request(
            entries, "net", "ns", None, Issues(), ALLOCATION_CONFIG, catalog=StaticCatalog()
        )
    assert len(cache) == 0 and cache.hits == 0


def test_claims_of_one_template_resolve_as_without_the_cache() -> None:
    cache = VerdictCache()
    for i in range(3):
        c = with_params(params(), name=f"c{i}", uid=f"u{i}")
        ref = ObjectRef("ns", f"c{i}", f"u{i}")
        assert resolve_claim(c, ref, "n1", DIRS, VIEW, verdicts=cache) == resolve_claim(
            c, ref, "n1", DIRS, VIEW
        )
    assert (cache.misses, cache.hits) == (1, 2)


async def test_prepare_judges_a_changed_namespace_label_anew(tmp_path: Path) -> None:
    """A class's policy selecting namespaces by label: the labels are part of what is judged,
    so a namespace that lost its label is refused though the same config passed before."""
    c = claim()
    c["metadata"]["name"] = "c"
    c["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"][
        "namespaceSelector"
    ] = {"matchLabels": {"networks": "self-service"}}
    cp = Checkpoint(StateLayout(tmp_path))
    labels = Labels({"networks": "self-service"})
    preparer = Preparer("n1", Claims(c), cp, DIRS, view=lambda: VIEW, namespaces=labels)
    assert (await preparer.prepare(REF)).devices
    await preparer.unprepare(REF)
    labels.value = {}
    with pytest.raises(PrepareError, match="may not define its network"):
        await preparer.prepare(REF)
    assert preparer.verdicts.misses == 2


async def test_a_batch_of_one_templates_claims_is_judged_once(tmp_path: Path) -> None:
    # L2 (no address): a tenant's static address needs the cluster IPAM, which this has not
    claims = [with_params(copy.deepcopy(l2_params()), f"c{i}", f"u{i}") for i in range(5)]
    for i, c in enumerate(claims):
        c["status"]["reservedFor"][0]["uid"] = f"pod-{i}"
    preparer = Preparer(
        "n1", Claims(*claims), Checkpoint(StateLayout(tmp_path)), DIRS, view=lambda: VIEW
    )
    answers = await preparer.prepare_batch([ObjectRef("ns", f"c{i}", f"u{i}") for i in range(5)])
    assert all(not isinstance(a, Exception) for a in answers)
    assert (preparer.verdicts.misses, preparer.verdicts.hits) == (1, 4)


def test_equal_networks_are_held_once_and_the_memory_is_bounded() -> None:
    shared = SharedNetworks(size=4)
    one, two = (
        resolve_claim(with_params(params(), f"c{i}", f"u{i}"), ObjectRef("ns", f"c{i}", f"u{i}"),
                      "n1", DIRS, VIEW)
        for i in range(2)
    )  # fmt: skip
    assert one.devices[0].network is not two.devices[0].network
    first, second = shared.share(one), shared.share(two)
    assert second == two and second.devices[0].network is first.devices[0].network
    for i in range(10):  # other networks: the oldest are forgotten, never more than `size`
        c = with_params(subnet(f"198.18.{i}.5/24"), f"d{i}", f"v{i}")
        shared.share(resolve_claim(c, ObjectRef("ns", f"d{i}", f"v{i}"), "n1", DIRS, VIEW))
    assert len(shared._by_text) == 4
    assert shared.share(one).devices[0].network is one.devices[0].network  # not remembered
