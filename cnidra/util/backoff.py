"""Exponential backoff with a cap and jitter: the one retry pace of every background loop and
of every apiserver retry (cnidra.kube.client's bounded retries, the keyed work queue of
cnidra.util.workqueue, the restarted watches and monitors)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.1  # +-10 %, so a fleet of nodes does not retry in step
    _next: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._next = self.initial

    def next(self) -> float:
        """The delay before the next attempt; each call grows it."""
        delay = self._next
        self._next = min(self._next * self.factor, self.maximum)
        return delay * (1 + random.uniform(-self.jitter, self.jitter))

    def reset(self) -> None:
        self._next = self.initial

    def after_run(self, ran: float, settled: float = 60.0) -> float:
        """The delay before restarting something long-running (a watch, a monitor) that ended
        after `ran` seconds: one that ran `settled` seconds or more had worked (the apiserver
        ends watches, as it does), so the pace starts again from `initial`."""
        if ran >= settled:
            self.reset()
        return self.next()
