"""A durable store's changes cost one fsync each, however many records they write (the
checkpoint of a 100-claim prepare is one fsync), and stay crash-safe: what a change wrote is
there after a crash at any of its writes once it returned, and a torn change is not."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cnidra.state import store as store_module
from cnidra.state.store import JsonDirStore

store_module_real = store_module.write_atomically


@dataclass(frozen=True)
class Rec:
    key: str
    value: int


def open_store(path: Path, *, durable: bool = True) -> JsonDirStore[Rec]:
    """A store of `path`/records (its log `path`/records.log)."""
    path = path / "records"
    return JsonDirStore[Rec](
        path,
        lambda d: Rec(str(d["key"]), int(d["value"])),
        lambda r: {"key": r.key, "value": r.value},
        lambda r: r.key,
        durable=durable,
    )


def counting_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


@pytest.mark.parametrize("n", [1, 2, 10, 100])
async def test_a_batch_of_n_records_costs_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    s = open_store(tmp_path)
    fsyncs = counting_fsyncs(monkeypatch)
    await s.put_many([Rec(f"r{i}", i) for i in range(n)])
    assert len(fsyncs) == 1
    fsyncs.clear()
    await s.put(Rec("one", 1))
    assert len(fsyncs) == 1
    assert sorted(r.key for r in open_store(tmp_path).all()) == sorted(
        [*(f"r{i}" for i in range(n)), "one"]
    )


async def test_a_batch_is_whole_after_a_crash_before_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after the logged change, at each of its file writes: reopened, all of it."""
    for crash_at in range(3):
        root = tmp_path / str(crash_at)
        s = open_store(root)
        await s.put(Rec("a", 0))
        real = store_module.write_atomically
        writes = [0]

        def crashing(
            path: Path,
            data: bytes,
            *args: Any,
            at: int = crash_at,
            writes: list[int] = writes,
            **kwargs: Any,
        ) -> None:
            if writes[0] == at:
                raise SystemExit("crash")
            writes[0] += 1
            store_module_real(path, data, *args, **kwargs)

        monkeypatch.setattr(store_module, "write_atomically", crashing)
        with pytest.raises(SystemExit):
            await s.put_many([Rec("a", 1), Rec("b", 2), Rec("c", 3)])
        monkeypatch.setattr(store_module, "write_atomically", real)
        again = open_store(root)
        assert {r.key: r.value for r in again.all()} == {"a": 1, "b": 2, "c": 3}
        # and the files say so too, for any reader of the directory: the log was emptied
        assert (root / "records.log").stat().st_size == 0
        files = sorted(p.name for p in (root / "records").glob("*.json"))
        assert files == ["a.json", "b.json", "c.json"]


async def test_a_torn_change_is_not_replayed_and_the_rest_is(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    await s.put_many([Rec("a", 1), Rec("b", 2)])
    await s.remove("a")
    with open(tmp_path / "records.log", "ab") as log:
        log.write(b"\x00\x00\x01\x00torn")  # a frame cut short by the crash
    again = open_store(tmp_path)
    assert {r.key: r.value for r in again.all()} == {"b": 2}  # the removal holds


async def test_a_failed_append_leaves_no_torn_frame_before_later_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = open_store(tmp_path)
    real = os.fsync

    def failing(fd: int) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError):
        await s.put_many([Rec("lost", 1), Rec("lost2", 2)])
    monkeypatch.setattr(os, "fsync", real)
    await s.put_many([Rec("kept", 3), Rec("kept2", 4)])
    again = open_store(tmp_path)
    assert sorted(r.key for r in again.all()) == ["kept", "kept2"]


async def test_a_long_log_is_settled_into_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "LOG_MAX", 200)
    s = open_store(tmp_path)
    for i in range(20):
        await s.put(Rec(f"r{i}", i))
    assert (tmp_path / "records.log").stat().st_size <= 200
    await s.remove("r0")
    assert {r.key for r in open_store(tmp_path).all()} == {f"r{i}" for i in range(1, 20)}


async def test_concurrent_changes_are_each_whole(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    await asyncio.gather(
        *(s.put_many([Rec(f"{i}-a", i), Rec(f"{i}-b", i)]) for i in range(10)),
        *(s.put(Rec(f"single-{i}", i)) for i in range(10)),
    )
    again = open_store(tmp_path)
    assert len(list(again.all())) == 30


async def test_a_store_for_the_process_only_has_no_log(tmp_path: Path) -> None:
    s = open_store(tmp_path, durable=False)
    await s.put_many([Rec("a", 1), Rec("b", 2)])
    assert not (tmp_path / "records.log").exists()
    assert sorted(r.key for r in open_store(tmp_path, durable=False).all()) == ["a", "b"]


async def test_removals_of_one_request_are_one_change_and_no_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = open_store(tmp_path)
    await s.put_many([Rec(f"r{i}", i) for i in range(4)])
    fsyncs = counting_fsyncs(monkeypatch)
    await s.remove_many(["r0", "r1", "r2"])
    assert fsyncs == []  # as an unlink: durable with the next change
    await s.put(Rec("next", 9))
    assert len(fsyncs) == 1
    assert {r.key for r in open_store(tmp_path).all()} == {"r3", "next"}


async def test_changes_asked_for_while_one_is_written_are_written_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: 50 concurrent puts cost one fsync for the first and one for all the rest
    (not 50), each still durable when it returns, each its own frame in the order asked."""
    s = open_store(tmp_path)
    fsyncs = counting_fsyncs(monkeypatch)
    await asyncio.gather(*(s.put(Rec(f"r{i}", i)) for i in range(50)))
    assert 1 <= len(fsyncs) <= 2
    assert {r.key for r in open_store(tmp_path).all()} == {f"r{i}" for i in range(50)}
    # the frames, replayed in order: a put then a removal of one key gathered together
    await asyncio.gather(s.put(Rec("x", 1)), s.put(Rec("y", 1)), s.remove("y"), s.put(Rec("x", 2)))
    assert s.get("x") == Rec("x", 2) and s.get("y") is None
    frames = store_module._frames((tmp_path / "records.log").read_bytes())
    assert [list(f["put"]) + f["remove"] for f in frames[-3:]] == [["y"], ["y"], ["x"]]
    again = open_store(tmp_path)
    assert again.get("x") == Rec("x", 2) and again.get("y") is None


async def test_a_failed_group_fails_each_of_its_changes_and_leaves_no_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = open_store(tmp_path)
    await s.put(Rec("before", 0))
    real = os.fsync

    def failing(fd: int) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "fsync", failing)
    results = await asyncio.gather(
        *(s.put(Rec(f"lost{i}", i)) for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, OSError) for r in results)
    assert {r.key for r in s.all()} == {"before"}  # nothing visible that is not durable
    monkeypatch.setattr(os, "fsync", real)
    await s.put(Rec("after", 1))
    assert {r.key for r in open_store(tmp_path).all()} == {"before", "after"}


async def test_a_failed_file_of_a_group_fails_that_change_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's frames are durable: the change whose file write failed is replayed on
    opening, the others are there at once."""
    s = open_store(tmp_path)
    await s.put(Rec("warm", 0))

    def crashing(path: Path, data: bytes, *args: Any, **kwargs: Any) -> None:
        if path.name == "b.json":
            raise OSError(28, "No space left on device")
        store_module_real(path, data, *args, **kwargs)

    monkeypatch.setattr(store_module, "write_atomically", crashing)
    results = await asyncio.gather(
        s.put(Rec("a", 1)), s.put(Rec("b", 2)), s.put(Rec("c", 3)), return_exceptions=True
    )
    assert [type(r) for r in results] == [type(None), OSError, type(None)]
    monkeypatch.setattr(store_module, "write_atomically", store_module_real)
    again = open_store(tmp_path)
    assert {r.key: r.value for r in again.all()} == {"warm": 0, "a": 1, "b": 2, "c": 3}
