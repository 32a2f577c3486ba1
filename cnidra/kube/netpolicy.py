"""What network policy needs from the apiserver, listed and then watched: MultiNetworkPolicies,
CNIAdminNetworkPolicies, Namespaces (their labels), Pods (their labels, named ports and the
network-status annotation cnidra writes: the peers' addresses on each network) and CNINetworks
(their namespace rules, for the tenancy rule; few, and seldom changed: the inventory's watch of
them only says that something changed, so policy keeps its own). DeviceClasses, which the
tenancy rule reads too, come from the one DeviceClass watch of the driver
(cnidra.kube.deviceclasses). Each kind is a
loop (`follow`; one supervised task runs them all, `follow_all`): list (the whole set,
`replace`), watch (`changed`), and list again whenever the watch ends or fails, after the one
backoff.

Why pods and their annotation: policy needs every pod's labels anyway (one watch of pods), and
the annotation carries the addresses on every network, as cnidra wrote them on the pod's node;
the claims' `status.devices[].networkData` would need a second watch (claims) joined to the
pods through `reservedFor`, and names no network."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from cnidra.api.constants import API_GROUP
from cnidra.api.netpolicy import ADMIN_KIND, ADMIN_PLURAL, MNP_GROUP, MNP_KIND, MNP_PLURAL
from cnidra.kube.api import Api, Namespace, Pod, cluster_wide, namespaced
from cnidra.kube.networks import CNINetwork
from cnidra.util.backoff import Backoff

log = logging.getLogger(__name__)

MultiNetworkPolicy = namespaced(MNP_GROUP, "v1beta1", MNP_KIND, MNP_PLURAL)
CNIAdminNetworkPolicy = cluster_wide(API_GROUP, "v1alpha1", ADMIN_KIND, ADMIN_PLURAL)
RESOURCES: Mapping[str, tuple[Any, bool]] = {  # kind -> (resource, namespaced)
    "MultiNetworkPolicy": (MultiNetworkPolicy, True),
    "CNIAdminNetworkPolicy": (CNIAdminNetworkPolicy, False),
    "Namespace": (Namespace, False),
    "Pod": (Pod, True),
    "CNINetwork": (CNINetwork, False),
}
LIST_TIMEOUT = 60.0


class Feed(Protocol):
    def replace(self, kind: str, objects: Sequence[Mapping[str, Any]]) -> None: ...
    def changed(self, kind: str, event: str, obj: Mapping[str, Any]) -> None: ...


def as_dict(obj: Any) -> Mapping[str, Any]:
    """The object as the apiserver sent it ({} for anything that is not an object)."""
    return obj if isinstance(obj, Mapping) else {}


async def follow_all(api: Api, feed: Feed, clock: Callable[[], float] = time.monotonic) -> None:
    """Every kind policy needs, each followed for ever (`follow`)."""
    await asyncio.gather(*(follow(api, kind, feed, clock) for kind in RESOURCES))


async def follow(
    api: Api, kind: str, feed: Feed, clock: Callable[[], float] = time.monotonic
) -> None:
    """List `kind` and watch it, for ever: a watch that ends (the apiserver ends them) or fails
    is followed by a list again, after the one backoff (a CRD not installed lists as empty and
    its watch fails: tried again at the backoff's pace, up to five minutes)."""
    resource, namespaced = RESOURCES[kind]
    scope = "*" if namespaced else None
    backoff = Backoff(initial=1.0, maximum=300.0)
    while True:
        started = clock()
        try:
            found = await api.list(
                resource, namespace=scope, within=LIST_TIMEOUT, missing_is_empty=True
            )
            feed.replace(kind, [as_dict(o) for o in found])
            async for event, obj in api.watch(resource, namespace=scope):
                if event in ("ADDED", "MODIFIED", "DELETED"):
                    feed.changed(kind, event, as_dict(obj))
            log.debug("%s watch ended; listing again", kind)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s list or watch for network policy failed: %s", kind, exc)
        await asyncio.sleep(backoff.after_run(clock() - started))
