"""A durable store's changes cost one fsync each, however many records they write (the
checkpoint of a 100-claim prepare is one fsync), write no record file until the store
settles, and stay crash-safe: what a change wrote is there after a crash at any write the
store makes (its log's, a settle's, an opening's, a close's) once it returned, and a torn
change is not."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from cnidra.state import store as store_module
from cnidra.state.store import JsonDirStore, read_records


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
    await s.quiet()  # the settle runs after the change that grew the log is acknowledged
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


def files(root: Path) -> dict[str, int]:
    return {
        p.stem: int(p.read_text().split('"value":')[1].rstrip("}"))
        for p in (root / "records").glob("*.json")
    }


def values(store: JsonDirStore[Rec]) -> dict[str, int]:
    return {r.key: r.value for r in store.all()}


async def test_a_change_writes_no_record_file_until_the_store_settles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = open_store(tmp_path)
    await s.put_many([Rec("a", 1), Rec("b", 2)])
    await s.put(Rec("c", 3))
    s.put_blocking(Rec("d", 4))
    await s.remove("b")
    assert files(tmp_path) == {}  # only the log: one frame a change
    assert values(s) == {"a": 1, "c": 3, "d": 4}  # read from memory while running
    s.close()  # a clean stop settles: the files whole, the log empty
    assert files(tmp_path) == {"a": 1, "c": 3, "d": 4}
    assert (tmp_path / "records.log").stat().st_size == 0
    # a log past LOG_MAX settles too, after the change that grew it
    monkeypatch.setattr(store_module, "LOG_MAX", 150)
    s = open_store(tmp_path)
    await s.put(Rec("e", 5))
    assert "e" not in files(tmp_path)
    for i in range(6):
        await s.put(Rec(f"f{i}", i))
    await s.quiet()
    assert files(tmp_path).items() >= {"e": 5, "f0": 0}.items()
    # what was logged while a settle wrote files waits for the next one
    assert (tmp_path / "records.log").stat().st_size < 7 * 30
    assert not (tmp_path / "records.settling").exists()


async def test_a_settle_while_running_holds_up_no_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The long log is set aside and its files written in a worker thread; changes meanwhile
    go into a new log and are acknowledged at once; opening replays both if it crashed."""
    import threading

    monkeypatch.setattr(store_module, "LOG_MAX", 100)
    writing, release = threading.Event(), threading.Event()
    real = store_module.write_all_atomically

    def held(files: list[tuple[Path, bytes]]) -> None:
        writing.set()
        assert release.wait(30), "never released"
        real(files)

    monkeypatch.setattr(store_module, "write_all_atomically", held)
    s = open_store(tmp_path)
    for i in range(4):
        await s.put(Rec(f"a{i}", i))
    assert await asyncio.to_thread(writing.wait, 30)  # a settle is writing the files
    assert (tmp_path / "records.settling").exists()
    for i in range(3):  # acknowledged while it writes
        await asyncio.wait_for(s.put(Rec(f"b{i}", i)), 30)
    assert values(s) == {**{f"a{i}": i for i in range(4)}, **{f"b{i}": i for i in range(3)}}
    # read from outside (and so opened after a crash) meanwhile: both logs replayed
    assert {k: v["value"] for k, v in read_records(tmp_path / "records").items()} == values(s)
    release.set()
    await s.quiet()
    assert not (tmp_path / "records.settling").exists()
    assert files(tmp_path) and files(tmp_path).items() <= values(s).items()  # the aside's
    assert {k: v["value"] for k, v in read_records(tmp_path / "records").items()} == values(s)
    s.close()
    assert files(tmp_path) == values(open_store(tmp_path))


async def test_the_reader_from_outside_sees_what_only_the_log_holds(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    await s.put_many([Rec("a", 1), Rec("b", 2)])
    s.close()
    s = open_store(tmp_path)
    await s.put(Rec("a", 10))  # only in the log
    await s.put(Rec("c", 3))
    await s.remove("b")  # its file still there
    assert files(tmp_path) == {"a": 1, "b": 2}
    log_before = (tmp_path / "records.log").read_bytes()
    listing = sorted(p.name for p in tmp_path.rglob("*"))
    records = read_records(tmp_path / "records")
    assert {k: v["value"] for k, v in records.items()} == {"a": 10, "c": 3}
    # read-only: nothing written, the log not emptied
    assert (tmp_path / "records.log").read_bytes() == log_before
    assert sorted(p.name for p in tmp_path.rglob("*")) == listing
    assert read_records(tmp_path / "missing") == {}


class Crash(BaseException):
    """The process dies here: nothing after it runs (every later write fails too)."""


class CrashAt:
    """Every write the store makes under `root` counted (a file or name created, bytes
    written, an fsync, a rename, an unlink, a truncation); the `at`-th and all after it
    raise Crash, as if the process had died there. `at` None counts without crashing."""

    CALLS: ClassVar[tuple[str, ...]] = ("open", "write", "fsync", "ftruncate", "replace", "unlink")

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path, at: int | None) -> None:
        self.root = str(root)
        self.at = at
        self.seen: list[str] = []
        self.targets: list[str] = []  # the paths renamed to and unlinked, in order
        self.armed = True
        for name in self.CALLS:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))

    def _ours(self, name: str, args: tuple[Any, ...]) -> bool:
        if name == "open":
            return str(args[0]).startswith(self.root) and bool(args[1] & os.O_CREAT)
        if name in ("replace", "unlink"):
            return str(args[-1] if name == "replace" else args[0]).startswith(self.root)
        try:
            return os.readlink(f"/proc/self/fd/{args[0]}").startswith(self.root)
        except OSError:
            return False

    def _wrap(self, name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.armed and self._ours(name, args):
                if self.at is not None and len(self.seen) >= self.at:
                    raise Crash(f"crashed at write #{self.at}: {name}")
                self.seen.append(name)
                if name in ("replace", "unlink"):
                    self.targets.append(str(args[-1] if name == "replace" else args[0]))
            return real(*args, **kwargs)

        return call


def script() -> list[tuple[str, Any]]:
    """Changes of every kind, reopenings (a settle on opening) and a clean close, with a
    LOG_MAX small enough that the log settles while running too."""
    ops: list[tuple[str, Any]] = []
    for i in range(6):
        ops.append(("put_many", [Rec(f"r{i}", i), Rec(f"r{i + 1}", 10 * i)]))
        ops.append(("put", Rec(f"s{i}", i)))
        if i % 2 == 1:
            ops.append(("remove_many", [f"r{i - 1}", f"s{i - 1}"]))
        if i % 3 == 2:
            ops.append(("put_blocking", Rec(f"b{i}", i)))
            ops.append(("remove", f"s{i}"))
        if i == 3:
            ops.append(("reopen", None))
    ops.append(("close", None))
    return ops


def applied(model: dict[str, int], op: str, arg: Any) -> dict[str, int]:
    out = dict(model)
    if op in ("put", "put_blocking"):
        out[arg.key] = arg.value
    elif op == "put_many":
        out.update({r.key: r.value for r in arg})
    elif op == "remove":
        out.pop(arg, None)
    elif op == "remove_many":
        for key in arg:
            out.pop(key, None)
    return out


async def run_script(
    root: Path, model: dict[str, int]
) -> tuple[tuple[str, Any] | None, JsonDirStore[Rec] | None]:
    """The script against a store of `root`, `model` kept to what was acknowledged; returns
    the change in flight when the crash came (None: none, or it came after the last ack) and
    the store last open."""
    s: JsonDirStore[Rec] | None = None
    for op, arg in [("reopen", None), *script()]:
        try:
            if op == "reopen":  # a restart: the process before it does nothing more
                if s is not None:
                    await s.quiet()
                s = open_store(root)
            elif op == "close":
                assert s is not None
                await s.quiet()
                s.close()
            elif op == "put_blocking":
                assert s is not None
                s.put_blocking(arg)
            else:
                await getattr(s, op)(arg)
        except Crash:
            return (op, arg), s
        new = applied(model, op, arg)
        model.clear()
        model.update(new)
        if op != "close" and s is not None:
            assert values(s) == model  # what it reads is what was acknowledged
    return None, s


async def test_a_crash_at_any_write_keeps_every_acknowledged_change_and_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each write of the whole script crashed at in turn: the changes' frames and fsyncs,
    the settles' files, renames, unlinks and truncations while running, on opening and on
    closing. Reopened (and read from outside before that), the store holds what was
    acknowledged, plus the change in flight whole or not at all."""
    monkeypatch.setattr(store_module, "LOG_MAX", 300)
    clean = tmp_path / "clean"
    counter = CrashAt(monkeypatch, clean, None)
    expected: dict[str, int] = {}
    assert (await run_script(clean, expected))[0] is None
    counter.armed = False
    total = len(counter.seen)
    # every kind of write the store makes is among those crashed at, settles' included
    assert set(counter.seen) == set(CrashAt.CALLS), counter.seen
    assert counter.seen.count("ftruncate") >= 2  # whole settles: on opening, on close
    # settles while running: the log set aside, then removed once its files are durable
    aside = str(clean / "records.settling")
    assert counter.targets.count(aside) >= 4, counter.targets
    assert files(clean) == expected
    for at in range(total):
        root = tmp_path / str(at)
        crash = CrashAt(monkeypatch, root, at)
        acked: dict[str, int] = {}
        in_flight, last = await run_script(root, acked)
        if last is not None:
            await last.quiet()  # a settle after an acknowledged change, crashed too
            for task in (last._writer, last._settler):
                if task is not None and not task.cancelled():
                    task.exception()  # retrieved: the crash it ended with
        crash.armed = False
        outside = {k: v["value"] for k, v in read_records(root / "records").items()}
        again = values(open_store(root))
        whole = [acked] + ([applied(acked, *in_flight)] if in_flight else [])
        assert again in whole, (at, crash.seen[-3:], in_flight)
        assert outside == again, at
        assert files(root) == again and (root / "records.log").stat().st_size == 0
        assert not (root / "records.settling").exists()
