"""A keyed work queue on the one backoff, in the shape of client-go's workqueue: a key is queued
at most once (a change to a queued key is not queued twice), each with the time it is due; a
key whose work failed is queued again after its own backoff (cnidra.util.backoff), so one key's
failures never hold up the others; a key done is forgotten, backoff included. Several kinds of
work share one queue through a `Lane` each: its keys are tagged with the lane's name."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar, cast

from cnidra.util.backoff import Backoff

K = TypeVar("K", bound=Hashable)
T = TypeVar("T", bound=Hashable)
NOW = 0.0  # the due time of a key due now (before every clock reading)


class WorkQueue(Generic[K]):
    def __init__(
        self,
        backoff: Callable[[], Backoff] = lambda: Backoff(0.5, 30.0),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backoff = backoff
        self.clock = clock
        self.due_times: dict[K, float] = {}  # key -> when it is due (NOW: at once)
        self.backoffs: dict[K, Backoff] = {}  # key -> its retry pace, while it fails

    def __len__(self) -> int:
        return len(self.due_times)

    def __contains__(self, key: object) -> bool:
        return key in self.due_times

    def __iter__(self) -> Iterator[K]:
        return iter(list(self.due_times))

    def add(self, key: K, after: float = 0.0) -> None:
        """Queue `key`, due now or `after` seconds from now; a key queued already keeps the
        sooner of the two (a change never puts off one due sooner, and a change due now is
        not held up by an earlier failure's backoff)."""
        due = NOW if after <= 0 else self.clock() + after
        self.due_times[key] = min(self.due_times.get(key, due), due)

    def hurry(self, which: Callable[[K], bool] | None = None) -> None:
        """Every queued key due now (a flush), or every one `which` picks."""
        for key in self.due_times:
            if which is None or which(key):
                self.due_times[key] = NOW

    def due(self) -> list[K]:
        """The keys due now, in the order they were queued."""
        now = self.clock()
        return [key for key, at in self.due_times.items() if at <= now]

    def retry(self, key: K) -> float:
        """`key`'s work failed: queued again after its backoff (rate-limited); the delay."""
        delay = self.backoffs.setdefault(key, self.backoff()).next()
        self.due_times[key] = self.clock() + delay
        return delay

    def forget(self, key: K) -> None:
        """`key`'s work went through in part (client-go's Forget): its backoff starts over at
        the next failure; the key stays queued as it is."""
        self.backoffs.pop(key, None)

    def done(self, key: K) -> None:
        """`key`'s work is done (or dropped): forgotten, its backoff with it."""
        self.due_times.pop(key, None)
        self.backoffs.pop(key, None)

    def wait(self) -> float | None:
        """Seconds until the next key is due (<= 0: one is due now); None: none is queued."""
        if not self.due_times:
            return None
        return min(self.due_times.values()) - self.clock()


class Lane(Generic[T]):
    """One kind of work's share of a WorkQueue that other kinds share: its keys are queued as
    (the lane's name, key), each with its own due time and backoff as any key."""

    def __init__(self, queue: WorkQueue[tuple[str, Hashable]], name: str) -> None:
        self.queue = queue
        self.name = name

    def __len__(self) -> int:
        return sum(1 for name, _ in self.queue if name == self.name)

    def __contains__(self, key: object) -> bool:
        return (self.name, key) in self.queue

    def add(self, key: T, after: float = 0.0) -> None:
        self.queue.add((self.name, key), after)

    def due(self) -> list[T]:
        return [cast(T, key) for name, key in self.queue.due() if name == self.name]

    def retry(self, key: T) -> float:
        return self.queue.retry((self.name, key))

    def forget(self, key: T) -> None:
        self.queue.forget((self.name, key))

    def done(self, key: T) -> None:
        self.queue.done((self.name, key))

    def hurry(self) -> None:
        self.queue.hurry(lambda key: key[0] == self.name)
