"""DeviceClasses, listed and then watched cluster-wide, for the bandwidth rules of their
CNIPolicies: the node follows a class's rules for the interfaces it runs while their pods run
(cnidra.nri.bandwidth), since what the allocation copied of the class cannot change; and for
their namespace rules, which network policy's tenancy rule reads (cnidra.nri.netpolicy): one
watch feeds both (`Feeds`). A cluster
has few DeviceClasses and they change seldom: one watch a driver, whose events are rare.

`follow_device_classes` is one loop: list (the whole set, `replace_classes`), watch
(`class_changed`), and list again whenever the watch ends or fails, after the one backoff."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from cnidra.kube.api import Api, DeviceClass
from cnidra.kube.netpolicy import as_dict
from cnidra.util.backoff import Backoff

log = logging.getLogger(__name__)

LIST_TIMEOUT = 60.0


class ClassFeed(Protocol):
    def replace_classes(self, objects: Sequence[Mapping[str, Any]]) -> None: ...

    def class_changed(self, event: str, obj: Mapping[str, Any]) -> None: ...


class Feeds:
    """Several feeds of the one DeviceClass watch, each told every list and event."""

    def __init__(self, *feeds: ClassFeed) -> None:
        self.feeds = feeds

    def replace_classes(self, objects: Sequence[Mapping[str, Any]]) -> None:
        for feed in self.feeds:
            feed.replace_classes(objects)

    def class_changed(self, event: str, obj: Mapping[str, Any]) -> None:
        for feed in self.feeds:
            feed.class_changed(event, obj)


async def follow_device_classes(
    api: Api, feed: ClassFeed, clock: Callable[[], float] = time.monotonic
) -> None:
    """List DeviceClasses and watch them, for ever."""
    backoff = Backoff(initial=1.0, maximum=300.0)
    while True:
        started = clock()
        try:
            found = await api.list(DeviceClass, within=LIST_TIMEOUT)
            feed.replace_classes([as_dict(o) for o in found])
            async for event, obj in api.watch(DeviceClass):
                if event in ("ADDED", "MODIFIED", "DELETED"):
                    feed.class_changed(event, as_dict(obj))
            log.debug("DeviceClass watch ended; listing again")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("DeviceClass list or watch for bandwidth rules failed: %s", exc)
        await asyncio.sleep(backoff.after_run(clock() - started))
