"""The IPAM state's records on disk are what dataclasses.asdict made of them before its
encoders were written out by hand (same fields, same order, same values), and read back equal."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

from cnidra.state.ipam import HeldBlock, IPAMState, Lease, _record
from cnidra.state.layout import StateLayout
from cnidra.state.store import read_records


def test_records_are_asdict() -> None:
    lease = Lease("pool-a", "fd00::5", "pool-a-3", "claim/u/r", "claim ns/c", 12.5)
    block = HeldBlock("pool-a", "pool-a-3", 1, 3, "fd00::/124", "uid-1")
    assert json.dumps(_record(lease)) == json.dumps(dataclasses.asdict(lease))
    assert json.dumps(_record(block)) == json.dumps(dataclasses.asdict(block))
    # a field added to either must be added to its record too
    assert list(_record(lease)) == [f.name for f in dataclasses.fields(Lease)]
    assert list(_record(block)) == [f.name for f in dataclasses.fields(HeldBlock)]


def test_reserve_stamps_once_and_round_trips(tmp_path: Path) -> None:
    layout = StateLayout(tmp_path)
    state = IPAMState(layout)
    block = HeldBlock("pool-a", "pool-a-0", 0, 0, "10.0.0.0/28", "uid-1")
    asyncio.run(state.hold(block))
    stamped = state.reserve(Lease("pool-a", "10.0.0.2", "pool-a-0", "claim/u/r", "claim ns/c"))
    assert stamped.since > 0
    kept = state.reserve(Lease("pool-a", "10.0.0.3", "pool-a-0", "claim/u/r", "", 7.0))
    assert kept.since == 7.0
    asyncio.run(state.commit([stamped, kept]))
    state.close()
    records = read_records(tmp_path / "pools" / "addresses")
    assert records[stamped.key] == dataclasses.asdict(stamped)
    assert records[kept.key] == dataclasses.asdict(kept)
    again = IPAMState(StateLayout(tmp_path))
    assert sorted(again.of_owner("claim/u/r"), key=lambda a: a.address) == [stamped, kept]
    assert again.held_blocks("pool-a") == [block]
    again.close()


def test_claim_owners_is_owners_filtered(tmp_path: Path) -> None:
    """The index of a claim's owners answers what walking every owner did, through leases,
    unleases, releases and a restart (the state read back from disk)."""
    state = IPAMState(StateLayout(tmp_path))
    owners = [
        "claim/u1/a",
        "claim/u1/b",
        "claim/u10/a",
        "claim/u2/a",
        "ipamclaim/ns/name/u1",
        "claim/x/y/z",  # a UID with a slash: not made by Kubernetes, still answered
    ]
    leases = [
        state.reserve(Lease("p", f"10.0.0.{i}", "p.0.0", owner, "", 1.0))
        for i, owner in enumerate(owners)
    ]
    asyncio.run(state.commit(leases))

    def check(s: IPAMState) -> None:
        for uid in ("u1", "u10", "u2", "x", "x/y", "u3", ""):
            prefix = f"claim/{uid}/"
            assert s.claim_owners(uid) == [o for o in s.owners() if o.startswith(prefix)], uid

    check(state)
    assert state.claim_owners("u1") == ["claim/u1/a", "claim/u1/b"]
    assert state.claim_owners("x/y") == ["claim/x/y/z"]
    asyncio.run(state.unlease(leases[0]))
    check(state)
    assert state.claim_owners("u1") == ["claim/u1/b"]
    asyncio.run(state.release_many(["claim/u1/b", "claim/u2/a"]))
    check(state)
    assert state.claim_owners("u1") == [] and state.claim_owners("u2") == []
    again = asyncio.run(_commit_again(state, "claim/u1/c"))
    check(again)
    state.close()
    reread = IPAMState(StateLayout(tmp_path))
    check(reread)
    assert reread.claim_owners("u1") == ["claim/u1/c"]
    reread.close()


async def _commit_again(state: IPAMState, owner: str) -> IPAMState:
    await state.commit([state.reserve(Lease("p", "10.0.0.9", "p.0.0", owner, "", 1.0))])
    return state
