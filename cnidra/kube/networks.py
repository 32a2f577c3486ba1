"""Named networks as prepare and the inventory read them: CNINetworks and Multus
NetworkAttachmentDefinitions from the apiserver (one GET each, with a timeout), node confs from
the CNI conf directory. Never used on the NRI hook path."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cnidra.api.constants import API_GROUP
from cnidra.api.networks import (
    CONF_EXTENSIONS,
    NAD_GROUP,
    NAD_KIND,
    NETWORK_KIND,
    NETWORK_PLURAL,
    NamedNetwork,
    NetworkRef,
    StaticCatalog,
    Unresolved,
    cninetwork,
    nad,
    network_id_problem,
    node_conf,
    with_routes,
)
from cnidra.kube.api import Api, AsyncClient, cluster_wide, namespaced
from cnidra.util.backoff import Backoff

log = logging.getLogger(__name__)
CNINetwork = cluster_wide(API_GROUP, "v1alpha1", NETWORK_KIND, NETWORK_PLURAL)
NetworkAttachmentDefinition = namespaced(
    NAD_GROUP, "v1", NAD_KIND, "network-attachment-definitions"
)
MAX_CONF_BYTES = 1024 * 1024


def read_node_conf(conf_dir: Path, network_id: str) -> NamedNetwork | Unresolved:
    """`<conf_dir>/<network_id>.{conflist,conf,json}`, as it is on disk now."""
    if network_id_problem(network_id):
        return node_conf(network_id, {}, str(conf_dir))
    files: dict[str, bytes | None] = {}
    for ext in CONF_EXTENSIONS:
        path = conf_dir / f"{network_id}{ext}"
        try:
            if path.stat().st_size > MAX_CONF_BYTES:
                return Unresolved(f"node conf {path} is larger than {MAX_CONF_BYTES} bytes")
            files[path.name] = path.read_bytes()
        except FileNotFoundError:
            files[path.name] = None
        except OSError as exc:
            return Unresolved(f"node conf {path} is unreadable: {exc.strerror}")
    return node_conf(network_id, files, str(conf_dir))


class NetworkReader:
    """cnidra.dra.prepare.NetworkLookup: what a claim's references name, read now."""

    def __init__(self, client: AsyncClient, conf_dir: Path, timeout: float = 5.0) -> None:
        self.client = client
        self.api = Api(client, timeout)
        self.conf_dir = conf_dir
        self.timeout = timeout

    async def catalog(self, refs: Sequence[tuple[NetworkRef, str]]) -> StaticCatalog:
        catalog = StaticCatalog()
        for ref, namespace in refs:
            key = StaticCatalog.key(ref, namespace)
            if key not in catalog.networks:
                catalog.networks[key] = await self._read(ref, namespace)
        return catalog

    async def refresh(self, network: NamedNetwork) -> NamedNetwork | Unresolved:
        """A network device's network with its node conf read again (it may have changed
        since the inventory published it)."""
        if network.network_id is None:
            return network
        conf = await asyncio.to_thread(read_node_conf, self.conf_dir, network.network_id)
        if isinstance(conf, Unresolved):
            return Unresolved(f"{network.reference}: {conf.message}")
        return NamedNetwork(
            **{
                **network.__dict__,
                "config": with_routes(conf.config, network.routes),
                "path": conf.path,
            }
        )

    async def _read(self, ref: NetworkRef, namespace: str) -> NamedNetwork | Unresolved:
        what = ref.describe(namespace)
        if ref.network_id is not None:
            return await asyncio.to_thread(read_node_conf, self.conf_dir, ref.network_id)
        try:
            if ref.name is not None:
                obj = await self._get(CNINetwork, ref.name, None)
                if obj is None:
                    return Unresolved(f"{what} was not found")
                conf = await self._node_conf_of(obj)
                return cninetwork(obj, conf)
            nad_namespace, name = ref.nad(namespace)
            obj = await self._get(NetworkAttachmentDefinition, name, nad_namespace)
            if obj is None:
                return Unresolved(f"{what} was not found")
            return nad(obj, trusted=False)
        except Exception as exc:  # the apiserver: prepare fails now and kubelet retries
            return Unresolved(f"{what} could not be read: {type(exc).__name__}: {exc}")

    async def _node_conf_of(self, obj: Mapping[str, Any]) -> NamedNetwork | Unresolved | None:
        network_id = (obj.get("spec") or {}).get("networkID")
        if not isinstance(network_id, str):
            return None
        return await asyncio.to_thread(read_node_conf, self.conf_dir, network_id)

    async def _get(self, kind: Any, name: str, namespace: str | None) -> dict[str, Any] | None:
        obj = await self.api.get_or_none(kind, name, namespace)
        if obj is None:
            return None
        data: dict[str, Any] = obj
        return data


async def list_networks(client: AsyncClient, limit: float = 10.0) -> list[dict[str, Any]]:
    """Every CNINetwork, for the inventory (within `limit` seconds); [] when the CRD is not
    installed."""
    found = await Api(client).list(CNINetwork, within=limit, missing_is_empty=True)
    return [dict(obj) for obj in found]


class ServedNetworks:
    """cnidra.inventory.publisher.NetworkSource: every CNINetwork with its node conf as this
    node has it; `watch` calls back on a CNINetwork change or a change in the conf directory.

    The CNINetworks are LISTed once and again only when the watch says one changed, when the
    watch (re)starts (it may have missed events), or when the listing is older than `max_age`
    (a watch that hangs without failing): a resync at rest costs the apiserver nothing. The
    node confs are read from disk each time."""

    def __init__(
        self,
        client: AsyncClient,
        conf_dir: Path,
        poll: float = 2.0,
        timeout: float = 10.0,
        max_age: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.conf_dir = conf_dir
        self.poll = poll
        self.timeout = timeout
        self.max_age = max_age
        self.clock = clock
        self._listed: tuple[float, list[dict[str, Any]]] | None = None
        self._stale = True

    async def _objects(self) -> list[dict[str, Any]]:
        if self._listed is not None and not self._stale:
            at, objects = self._listed
            if self.clock() - at < self.max_age:
                return objects
        self._stale = False  # a change seen during the LIST marks it stale again
        try:
            objects = await list_networks(self.client, self.timeout)
        except BaseException:
            self._stale = True
            raise
        self._listed = (self.clock(), objects)
        return objects

    async def served(self) -> list[tuple[str, NamedNetwork]]:
        out = []
        for obj in await self._objects():
            name = str(obj["metadata"]["name"])
            network_id = (obj.get("spec") or {}).get("networkID")
            conf = (
                await asyncio.to_thread(read_node_conf, self.conf_dir, network_id)
                if isinstance(network_id, str)
                else None
            )
            found = cninetwork(obj, conf)
            if isinstance(found, NamedNetwork):
                out.append((name, found))
            else:
                log.debug("CNINetwork %s not served here: %s", name, found.message)
        return out

    async def watch(self, changed: Callable[[], None]) -> None:
        await asyncio.gather(self._watch_objects(changed), self._watch_dir(changed))

    def _changed_object(self, changed: Callable[[], None]) -> None:
        self._stale = True
        changed()

    async def _watch_objects(self, changed: Callable[[], None]) -> None:
        backoff = Backoff(initial=5.0, maximum=300.0)
        while True:
            # a watch started without a resourceVersion opens with every object as ADDED,
            # which marks the listing stale: what changed while no watch was held is read
            started = self.clock()
            try:
                async for _event, _obj in Api(self.client).watch(CNINetwork):
                    self._changed_object(changed)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("CNINetwork watch ended (%s)", exc)
            self._stale = True
            # one that ran a minute had worked: the apiserver ended it, as it does
            await asyncio.sleep(backoff.after_run(self.clock() - started, settled=60.0))

    async def _watch_dir(self, changed: Callable[[], None]) -> None:
        last = None
        while True:
            now = await asyncio.to_thread(_dir_signature, self.conf_dir)
            if last is not None and now != last:
                changed()
            last = now
            await asyncio.sleep(self.poll)


def _dir_signature(conf_dir: Path) -> tuple[tuple[str, int, int], ...]:
    try:
        return tuple(
            sorted(
                (p.name, p.stat().st_mtime_ns, p.stat().st_size)
                for p in conf_dir.iterdir()
                if p.suffix in CONF_EXTENSIONS
            )
        )
    except OSError:
        return ()
