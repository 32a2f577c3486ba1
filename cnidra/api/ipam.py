"""cnidra's cluster-wide IPAM, the pure part: pools, the blocks they are cut into, and the static
IPAM config an allocation becomes. No I/O (cnidra/ipam allocates, cnidra/kube reads and writes
the objects). docs/ipam.md.

- A **CNIIPPool** (cluster-scoped, the admin's) has one range per address family, exclusions,
  routes, the block size and whether IPAMClaims may hold its addresses (`allowPersistentIPs`).
- A network asks for it with `"ipam": {"type": "cnidra", "pool": "<name>"}`; at prepare the
  driver picks the addresses and the plugin gets `static` IPAM with them.
- A pool's ranges are cut into aligned **blocks** of `blockSize` addresses. A node reserves a
  block by creating a **CNIIPBlock** named after it (creation is the reservation: the
  apiserver refuses a second one), then hands out the block's addresses itself, with no
  apiserver call per pod. Two nodes never hold the same block, so never the same address.
- An **IPAMClaim** (k8s.cni.cncf.io, KubeVirt's persistent IPs) named by a CNIConfig's
  `ipamClaimReference` keeps its addresses until it is deleted.
- A tenant's own **static** addresses (`static_ipam_addresses`) are leased from the one pool
  whose range holds each, as if that pool had handed them out.
- A pool's **reservations** pin an address to a pod by its name (`namespace/name`): that pod
  gets it every time it starts (a StatefulSet's pod keeps it across restarts and nodes, as a
  whereabouts allocation keyed by pod reference did; `cnidra convert` writes them from
  whereabouts' objects), and no other pod, static address or IPAMClaim ever does.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from cnidra.api.claimspec import read_requests
from cnidra.api.constants import API_GROUP, API_VERSION
from cnidra.api.issues import ROOT, Issues

IPAM_TYPE = "cnidra"
POOL_KIND = "CNIIPPool"
POOL_PLURAL = "cniippools"
BLOCK_KIND = "CNIIPBlock"
BLOCK_PLURAL = "cniipblocks"
LABEL_POOL = f"{API_GROUP}/pool"
LABEL_NODE = f"{API_GROUP}/node"
USABLE_KEPT = 256  # a block of at most this many addresses keeps its usable ones listed
IPAMCLAIM_GROUP = "k8s.cni.cncf.io"
IPAMCLAIM_VERSION = "v1alpha1"
IPAMCLAIM_KIND = "IPAMClaim"
IPAMCLAIM_PLURAL = "ipamclaims"
# held on an IPAMClaim from the moment cnidra wrote its addresses until the node holding them
# freed them
IPAMCLAIM_FINALIZER = "cni.dra.networking.x-k8s.io/ipam"
# which node holds an IPAMClaim's addresses (in one of its blocks): that node releases them
IPAMCLAIM_NODE_LABEL = f"ipam.{API_GROUP}/node"
CONDITION_IPS_ALLOCATED = "IPsAllocated"
# pool names leave room for ".<range>.<block index>" in a block's name (253 at most)
POOL_NAME_MAX = 200
BLOCK_SIZE_DEFAULT = 16
BLOCK_SIZE_MAX = 1024
RESERVATIONS_MAX = 10_000
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Interface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


def pool_name_problem(name: Any) -> str | None:
    if not isinstance(name, str) or not name:
        return "must name a CNIIPPool"
    if len(name) > POOL_NAME_MAX or not _OBJECT_NAME.match(name):
        return (
            f"{name!r} is not a CNIIPPool name: lower-case letters, digits, '-' and '.', "
            f"at most {POOL_NAME_MAX} characters"
        )
    return None


class IPRange(BaseModel):
    """One address family of a pool: the subnet plugins see (prefix length, gateway) and the
    part of it cnidra hands out."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    subnet: Network
    range_start: Address | None = Field(None, alias="rangeStart")
    range_end: Address | None = Field(None, alias="rangeEnd")
    gateway: Address | None = None

    @model_validator(mode="after")
    def _inside(self) -> IPRange:
        for name, ip in (
            ("rangeStart", self.range_start),
            ("rangeEnd", self.range_end),
            ("gateway", self.gateway),
        ):
            if ip is not None and (ip.version != self.subnet.version or ip not in self.subnet):
                raise ValueError(f"{name} {ip} is not in subnet {self.subnet}")
        if int(self.first) > int(self.last):
            raise ValueError(f"the range {self.first}-{self.last} holds no address")
        return self

    @property
    def first(self) -> Address:
        if self.range_start is not None:
            return self.range_start
        net = self.subnet
        small = net.version == 4 and net.prefixlen >= 31
        return net.network_address if small else net.network_address + 1

    @property
    def last(self) -> Address:
        if self.range_end is not None:
            return self.range_end
        net = self.subnet
        small = net.version == 4 and net.prefixlen >= 31
        return net.broadcast_address if small or net.version == 6 else net.broadcast_address - 1


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    dst: Network
    gw: Address | None = None


def pod_ref_problem(ref: Any) -> str | None:
    """Why `ref` is not a pod's `namespace/name` (whereabouts' podref shape)."""
    if not isinstance(ref, str) or ref.count("/") != 1:
        return f"{_shown(ref)} is not namespace/name"
    namespace, name = ref.split("/")
    if len(namespace) > 63 or not _NAMESPACE.match(namespace):
        return f"{_shown(namespace)} is not a namespace name (lower-case, at most 63)"
    if len(name) > 253 or not _OBJECT_NAME.match(name):
        return f"{_shown(name)} is not a pod name (lower-case, at most 253)"
    return None


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-1]}"


class Reservation(BaseModel):
    """An address pinned to a pod by name: that pod gets it wherever and whenever it runs, and
    no one else ever does."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    address: Address
    pod: str

    @field_validator("address", mode="before")
    @classmethod
    def _address(cls, value: Any) -> Address:
        """A string, as the CRD has it (YAML's 169082901 or true is no address), one IPv4 or
        IPv6 address written plainly: no prefix, no zone (`%eth0` would make two spellings of
        one address), no leading zeros."""
        if not isinstance(value, str):
            raise ValueError(f"{_shown(value)} is not a string holding an IPv4 or IPv6 address")
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{_shown(value)} is not an IPv4 or IPv6 address") from None
        if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
            raise ValueError(f"{_shown(value)} has a zone (%...): write the address alone")
        return address

    @field_validator("pod", mode="before")
    @classmethod
    def _pod(cls, value: Any) -> str:
        problem = pod_ref_problem(value)
        if problem:
            raise ValueError(problem)
        return str(value)


class PoolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ranges: list[IPRange] = Field(min_length=1, max_length=2)
    exclude: list[Network] = Field(default_factory=list)
    routes: list[Route] = Field(default_factory=list)
    block_size: int = Field(BLOCK_SIZE_DEFAULT, alias="blockSize", ge=1, le=BLOCK_SIZE_MAX)
    allow_persistent_ips: bool = Field(False, alias="allowPersistentIPs")
    namespaces: list[str] | None = None
    # a pool object stays well under etcd's 1.5 MiB with the most (the CRD's maxItems too)
    reservations: list[Reservation] = Field(default_factory=list, max_length=RESERVATIONS_MAX)

    @model_validator(mode="after")
    def _shape(self) -> PoolSpec:
        if len({r.subnet.version for r in self.ranges}) != len(self.ranges):
            raise ValueError("ranges: at most one range per address family (one IPv4, one IPv6)")
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"blockSize: {self.block_size} is not a power of two")
        for r in self.ranges:
            if self.block_size > r.subnet.num_addresses:
                raise ValueError(
                    f"blockSize: {self.block_size} addresses do not fit in subnet {r.subnet}"
                )
        self._check_reservations()
        return self

    def _check_reservations(self) -> None:
        """Each reserved address one the pool hands out, reserved once; a pod at most one
        address of each family (one pass, sets: a pool may reserve thousands)."""
        seen: dict[Address, str] = {}
        families: set[tuple[str, int]] = set()
        for i, res in enumerate(self.reservations):
            at = f"reservations[{i}]"
            address = res.address
            r = next((r for r in self.ranges if r.subnet.version == address.version), None)
            if r is None or not int(r.first) <= int(address) <= int(r.last):
                raise ValueError(f"{at}.address: {address} is not in the pool's ranges")
            if address == r.gateway or any(
                n.version == address.version and address in n for n in self.exclude
            ):
                raise ValueError(
                    f"{at}.address: {address} is the gateway or excluded; the pool never "
                    "hands it out"
                )
            if address in seen:
                raise ValueError(
                    f"{at}.address: {address} is reserved twice ({seen[address]} and {res.pod})"
                )
            seen[address] = res.pod
            if (res.pod, address.version) in families:
                raise ValueError(
                    f"{at}.pod: {res.pod} already has an IPv{address.version} address reserved; "
                    "a pod gets one address of each family"
                )
            families.add((res.pod, address.version))


@dataclass(frozen=True)
class BlockObject:
    """A CNIIPBlock as the apiserver has it."""

    name: str
    pool: str
    node: str
    uid: str
    resource_version: str = ""
    owned: bool = True  # by its Node (blocks made before cnidra set owners are not)


@dataclass(frozen=True)
class Block:
    """An aligned run of `size` addresses of a pool's range, reserved by one node at a time."""

    pool: str
    range_index: int
    index: int
    cidr: Network

    @property
    def name(self) -> str:
        return block_name(self.pool, self.range_index, self.index)


def block_name(pool: str, range_index: int, index: int) -> str:
    return f"{pool}.{range_index}.{index}"


@dataclass(frozen=True)
class Pool:
    name: str
    spec: PoolSpec

    def block_indices(self, range_index: int) -> range:
        """The blocks of a range that hold at least one of its addresses."""
        r = self.spec.ranges[range_index]
        base = int(r.subnet.network_address)
        size = self.spec.block_size
        return range((int(r.first) - base) // size, (int(r.last) - base) // size + 1)

    def block(self, range_index: int, index: int) -> Block:
        r = self.spec.ranges[range_index]
        start = int(r.subnet.network_address) + index * self.spec.block_size
        prefix = r.subnet.max_prefixlen - (self.spec.block_size.bit_length() - 1)
        network = ipaddress.IPv6Network if r.subnet.version == 6 else ipaddress.IPv4Network
        return Block(self.name, range_index, index, network((start, prefix)))

    def block_of(self, address: Address) -> Block | None:
        for i, r in enumerate(self.spec.ranges):
            if address.version == r.subnet.version and int(r.first) <= int(address) <= int(r.last):
                offset = int(address) - int(r.subnet.network_address)
                return self.block(i, offset // self.spec.block_size)
        return None

    def range_of(self, address: Address) -> IPRange | None:
        """The range whose addresses to hand out (rangeStart to rangeEnd) hold `address`."""
        block = self.block_of(address)
        return self.spec.ranges[block.range_index] if block is not None else None

    def in_subnet(self, address: Address) -> bool:
        return any(
            address.version == r.subnet.version and address in r.subnet for r in self.spec.ranges
        )

    @functools.cached_property
    def _reserved(self) -> dict[Address, str]:
        return {r.address: r.pod for r in self.spec.reservations}

    def reserved_for(self, address: Address) -> str | None:
        """The pod (`namespace/name`) `address` is reserved for, if any."""
        return self._reserved.get(address)

    @functools.cached_property
    def _by_pod(self) -> dict[str, list[Address]]:
        out: dict[str, list[Address]] = {}
        for r in self.spec.reservations:
            out.setdefault(r.pod, []).append(r.address)
        return out

    def reservations_of(self, pod: str) -> list[Address]:
        """The addresses reserved for the pod `namespace/name`, one per family at most."""
        return list(self._by_pod.get(pod, ()))

    def hands_out(self, address: Address) -> bool:
        """Whether a pod may get `address` from this pool (`usable`): inside a range, not
        excluded, not the gateway."""
        block = self.block_of(address)
        return block is not None and address in set(self.usable(block))

    def usable(self, block: Block) -> Iterator[Address]:
        """The block's addresses a pod may get, lowest first: inside the range, not excluded,
        not the gateway."""
        r = self.spec.ranges[block.range_index]
        excluded = [n for n in self.spec.exclude if n.version == r.subnet.version]
        low = max(int(block.cidr.network_address), int(r.first))
        high = min(int(block.cidr.broadcast_address), int(r.last))
        make = ipaddress.IPv6Address if r.subnet.version == 6 else ipaddress.IPv4Address
        for value in range(low, high + 1):
            address: Address = make(value)
            if address == r.gateway or any(address in n for n in excluded):
                continue
            yield address

    @functools.cached_property
    def _usable_texts(self) -> dict[str, tuple[tuple[Address, str], ...]]:
        return {}

    def usable_texts(self, block: Block) -> tuple[tuple[Address, str], ...]:
        """`usable(block)`, each address with its text, kept for the blocks of at most
        USABLE_KEPT addresses (an allocation looks at its node's blocks again and again)."""
        kept = self._usable_texts.get(block.name)
        if kept is not None:
            return kept
        pairs = tuple((a, str(a)) for a in self.usable(block))
        if block.cidr.num_addresses <= USABLE_KEPT:
            self._usable_texts[block.name] = pairs
        return pairs

    def usable_texts_at(self, range_index: int, index: int) -> tuple[tuple[Address, str], ...]:
        """`usable_texts(self.block(range_index, index))`, without making the block again when
        its addresses are kept (they are kept by the block's name, which its indexes make)."""
        kept = self._usable_texts.get(block_name(self.name, range_index, index))
        if kept is not None:
            return kept
        return self.usable_texts(self.block(range_index, index))

    def range_capacity(self, range_index: int) -> int:
        """How many addresses of a range pods can get (counted, not walked: an IPv6 range may
        hold 2**64)."""
        r = self.spec.ranges[range_index]
        first, last = int(r.first), int(r.last)
        excluded = list(
            ipaddress.collapse_addresses(  # type: ignore[type-var]
                n for n in self.spec.exclude if n.version == r.subnet.version
            )
        )
        count = last - first + 1
        for net in excluded:
            low = max(first, int(net.network_address))
            high = min(last, int(net.broadcast_address))
            count -= max(0, high - low + 1)
        gw = r.gateway
        if gw is not None and first <= int(gw) <= last and not any(gw in n for n in excluded):
            count -= 1
        return max(count, 0)

    def capacity(self) -> int:
        """Pods the pool can serve: a dual-stack pod takes one address of each range."""
        return min(self.range_capacity(i) for i in range(len(self.spec.ranges)))

    def first_block_to_try(self, range_index: int, node: str) -> int:
        """Where a node starts looking for a free block: spread by its name, so nodes do not all
        race for the first one."""
        indices = self.block_indices(range_index)
        digest = int.from_bytes(hashlib.sha256(node.encode()).digest()[:8], "big")
        return indices.start + digest % len(indices)

    def interface(self, address: Address) -> Interface:
        for r in self.spec.ranges:
            if address.version == r.subnet.version and address in r.subnet:
                return ipaddress.ip_interface(f"{address}/{r.subnet.prefixlen}")
        raise ValueError(f"{address} is in no range of CNIIPPool {self.name}")

    def interface_text(self, address: Address) -> str:
        """`str(self.interface(address))`, without parsing the text it is made of again: an
        address's text (compressed, no scope) and its range's prefix length."""
        for r in self.spec.ranges:
            if address.version == r.subnet.version and address in r.subnet:
                return f"{address}/{r.subnet.prefixlen}"
        raise ValueError(f"{address} is in no range of CNIIPPool {self.name}")

    def static_ipam(self, addresses: Sequence[Address], extra: Mapping[str, Any]) -> dict[str, Any]:
        """What the plugin gets: the `static` IPAM plugin with the chosen addresses, the pool's
        gateways and routes, and the network's own routes and dns (pod-side only); no other
        field of a network's ipam object reaches the plugin."""
        entries = []
        for address in addresses:
            entry: dict[str, Any] = {"address": self.interface_text(address)}
            gateway = next(
                (
                    r.gateway
                    for r in self.spec.ranges
                    if r.gateway is not None and address.version == r.gateway.version
                ),
                None,
            )
            if gateway is not None:
                entry["gateway"] = str(gateway)
            entries.append(entry)
        ipam: dict[str, Any] = {"type": "static", "addresses": entries}
        if isinstance(extra.get("dns"), Mapping):  # the network's own, nothing else passes
            ipam["dns"] = dict(extra["dns"])
        routes: list[Mapping[str, Any]] = [
            {"dst": str(r.dst), **({"gw": str(r.gw)} if r.gw is not None else {})}
            for r in self.spec.routes
        ]
        routes += [r for r in extra.get("routes") or [] if isinstance(r, Mapping)]
        if routes:
            ipam["routes"] = routes
        return ipam

    def allows_namespace(self, namespace: str) -> bool:
        return self.spec.namespaces is None or namespace in self.spec.namespaces

    def tenant_problem(self, namespace: str, allowed: Sequence[Network] | None) -> str | None:
        """Why a network a tenant wrote (its claim's, or its namespace's
        NetworkAttachmentDefinition) may not take addresses from this pool: a pool serves a
        tenant's own networks only where it names the namespace (one without `namespaces`
        serves the admins' networks alone), and only with addresses inside the ranges the
        DeviceClass allows claims (`claims.ipRanges`), as for an address the tenant writes."""
        if self.spec.namespaces is None:
            return (
                f"CNIIPPool {self.name} serves only admins' networks (it lists no "
                f"spec.namespaces); a claim's own network may use a pool whose spec.namespaces "
                f"names {namespace}"
            )
        if namespace not in self.spec.namespaces:
            return f"CNIIPPool {self.name} does not serve namespace {namespace} (spec.namespaces)"
        if allowed is None:
            return None
        for r in self.spec.ranges:
            inside = any(
                n.version == r.subnet.version and n.supernet_of(r.subnet)  # type: ignore[arg-type]
                for n in allowed
            )
            if not inside:
                return (
                    f"CNIIPPool {self.name}'s range {r.subnet} is outside the ranges this "
                    "DeviceClass allows claims: " + (", ".join(map(str, allowed)) or "none")
                )
        return None


@dataclass(frozen=True)
class PoolCounts:
    """A pool's accounting across the cluster: `size` addresses pods can get (a dual-stack pod
    takes one of each range: the smaller range's count), `held` the addresses leased by every
    node's claims and IPAMClaims (as the nodes last wrote them in their blocks' status), and
    `blocks` of `pool_blocks` reserved by nodes."""

    pool: str
    size: int
    held: int
    blocks: int = 0
    pool_blocks: int = 0

    @property
    def free(self) -> int:
        return max(self.size - self.held, 0)

    @property
    def used(self) -> float:
        """The share of the pool held, 0 to 1 (1 for a pool of no address)."""
        return min(self.held / self.size, 1.0) if self.size else 1.0

    def status(self) -> dict[str, int]:
        """The pool's `status`, as `kubectl get cniippools` shows it."""
        return {
            "size": self.size,
            "held": self.held,
            "free": self.free,
            "blocks": self.blocks,
            "poolBlocks": self.pool_blocks,
        }


EXHAUSTED_REASON = "PoolExhausted"


def exhausted_message(counts: PoolCounts, claim: str = "") -> str:
    """What a Pending pod's Events and its claim say when its pool has no address left."""
    who = f"claim {claim}: " if claim else ""
    return (
        f"{who}CNIIPPool {counts.pool} has no address left on any node: {counts.size} "
        f"addresses, {counts.held} held, {counts.free} free "
        f"({counts.blocks} of {counts.pool_blocks} blocks reserved by nodes)"
    )


_SELECTOR_LITERAL = re.compile(
    r"""device\.attributes\[\s*["']([^"']+)["']\s*\]\.(network|ipPool)\s*==\s*["']([^"']*)["']"""
)


def selector_names(expression: str, driver: str) -> dict[str, set[str]]:
    """The network and pool names a CEL selector compares the driver's device attributes
    with (`device.attributes["<driver>"].network == "x"`): "network" and "ipPool" -> names.
    Only equality to a literal is read; any other expression names nothing."""
    found: dict[str, set[str]] = {"network": set(), "ipPool": set()}
    for domain, attribute, value in _SELECTOR_LITERAL.findall(expression):
        if domain == driver:
            found[attribute].add(value)
    return found


def claim_pools(
    claim: Mapping[str, Any], driver: str, network_pools: Mapping[str, str]
) -> set[str]:
    """The pools an unallocated claim's requests ask addresses of: those its selectors name
    (`ipPool`), and those of the networks they name (`network_pools`: network -> pool, as the
    nodes publish them)."""
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    if not isinstance(devices, Mapping):
        return set()
    # the one reader of a claim's spec, lenient: a request it cannot read asks no pool
    requests = read_requests(devices, ROOT / "spec" / "devices", Issues())
    pools: set[str] = set()
    for request in requests:
        for cel in request.selectors:
            names = selector_names(cel, driver)
            pools |= names["ipPool"]
            pools |= {network_pools[n] for n in names["network"] if n in network_pools}
    return pools


class PoolError(ValueError):
    """A pool that cannot be used, or a use of it that is not allowed: the message names it."""


def pool_from_object(obj: Mapping[str, Any]) -> Pool:
    meta = obj.get("metadata")
    name = str((meta if isinstance(meta, dict) else {}).get("name") or "?")
    problem = pool_name_problem(name)
    if problem:
        raise PoolError(f"{POOL_KIND} {problem}")
    try:
        spec = PoolSpec.model_validate(obj.get("spec") or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        loc = loc.removeprefix(".")
        message = str(first["msg"]).removeprefix("Value error, ")
        where = f"spec.{loc}: " if loc else "spec."  # the spec's own rules name their field
        raise PoolError(f"{POOL_KIND} {name} is invalid: {where}{message}") from None
    return Pool(name, spec)


def cnidra_ipam(conflist: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any]]]:
    """The plugins (index, ipam object) of a conflist that ask for cnidra's IPAM."""
    found = []
    plugins = conflist.get("plugins")
    for i, plugin in enumerate(plugins if isinstance(plugins, list) else []):
        ipam = plugin.get("ipam") if isinstance(plugin, Mapping) else None
        if isinstance(ipam, Mapping) and ipam.get("type") == IPAM_TYPE:
            found.append((i, ipam))
    return found


def pool_of(conflist: Mapping[str, Any]) -> str | None:
    """The CNIIPPool a network's cnidra IPAM names, if it uses it."""
    found = cnidra_ipam(conflist)
    pool = found[0][1].get("pool") if found else None
    return pool if isinstance(pool, str) else None


def with_static_ipam(
    conflist: Mapping[str, Any], pool: Pool, addresses: Sequence[Address]
) -> dict[str, Any]:
    """The conflist with its cnidra IPAM replaced by static IPAM of these addresses."""
    plugins = []
    for plugin in conflist.get("plugins") or []:
        ipam = plugin.get("ipam") if isinstance(plugin, Mapping) else None
        if isinstance(ipam, Mapping) and ipam.get("type") == IPAM_TYPE:
            plugins.append({**plugin, "ipam": pool.static_ipam(addresses, ipam)})
        else:
            plugins.append(plugin)
    return {**conflist, "plugins": plugins}


STATIC_IPAM_TYPE = "static"


def static_ipam_addresses(
    conflist: Mapping[str, Any],
    cni_args: Sequence[tuple[str, str]] = (),
    capability_args: Mapping[str, Any] | None = None,
) -> list[str]:
    """Every address the `static` IPAM plugins of a conflist could give the pod, from each
    place the plugin reads one: `ipam.addresses[].address`, the plugin's `args.cni.ips`, the
    runtime's `ips` capability (runtimeConfig.ips, to a plugin that declares it) and CNI_ARGS'
    `IP` (comma-separated; the last `IP` of CNI_ARGS counts, as Go's LoadArgs reads it).
    Plugin versions differ in which of them wins over the others, so all are counted. The
    text as written (CIDR notation), each once, in that order."""
    found: list[str] = []
    env = [value for key, value in cni_args if key == "IP"]
    env_ips = [part.strip() for part in env[-1].split(",") if part.strip()] if env else []
    runtime = (capability_args or {}).get("ips")
    plugins = conflist.get("plugins")
    for plugin in plugins if isinstance(plugins, list) else []:
        if not isinstance(plugin, Mapping):
            continue
        ipam = plugin.get("ipam")
        if not isinstance(ipam, Mapping) or ipam.get("type") != STATIC_IPAM_TYPE:
            continue
        entries = ipam.get("addresses")
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, Mapping) and isinstance(entry.get("address"), str):
                found.append(entry["address"])
        args = plugin.get("args")
        cni = args.get("cni") if isinstance(args, Mapping) else None
        ips = cni.get("ips") if isinstance(cni, Mapping) else None
        found += [ip for ip in (ips if isinstance(ips, list) else []) if isinstance(ip, str)]
        capabilities = plugin.get("capabilities")
        if isinstance(capabilities, Mapping) and capabilities.get("ips") is True:
            found += [str(ip) for ip in (runtime if isinstance(runtime, list) else [])]
        found += env_ips
    return list(dict.fromkeys(found))


def parse_claim_ips(values: Any) -> list[Interface]:
    """An IPAMClaim's `status.ips` (CIDR strings); ValueError for anything else."""
    if values is None:
        return []
    if not isinstance(values, list):
        raise ValueError("status.ips must be a list of CIDR strings")
    return [ipaddress.ip_interface(str(v)) for v in values]


def pool_crd() -> dict[str, Any]:
    ip = {"type": "string", "maxLength": 45}
    cidr = {"type": "string", "maxLength": 49}
    immutable = [{"rule": "self == oldSelf", "message": "is immutable: make a new pool"}]
    spec = {
        "type": "object",
        "required": ["ranges"],
        "properties": {
            "ranges": {
                "type": "array",
                "minItems": 1,
                "maxItems": 2,
                "x-kubernetes-validations": immutable,
                "items": {
                    "type": "object",
                    "required": ["subnet"],
                    "properties": {
                        "subnet": cidr,
                        "rangeStart": ip,
                        "rangeEnd": ip,
                        "gateway": ip,
                    },
                },
            },
            "exclude": {"type": "array", "items": cidr},
            "routes": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["dst"],
                    "properties": {"dst": cidr, "gw": ip},
                },
            },
            "blockSize": {
                "type": "integer",
                "minimum": 1,
                "maximum": BLOCK_SIZE_MAX,
                "x-kubernetes-validations": immutable,
            },
            "allowPersistentIPs": {"type": "boolean"},
            "namespaces": {"type": "array", "items": {"type": "string"}},
            "reservations": {
                "type": "array",
                "maxItems": RESERVATIONS_MAX,
                "description": "Addresses pinned to pods by name (namespace/name): that pod "
                "gets its address wherever it runs, no other pod ever does.",
                "items": {
                    "type": "object",
                    "required": ["address", "pod"],
                    "properties": {
                        "address": ip,
                        "pod": {"type": "string", "maxLength": 317},
                    },
                },
            },
        },
    }
    return _crd(
        POOL_KIND,
        POOL_PLURAL,
        ["cnipool"],
        spec,
        [
            {"name": "Ranges", "type": "string", "jsonPath": ".spec.ranges[*].subnet"},
            {"name": "BlockSize", "type": "integer", "jsonPath": ".spec.blockSize"},
            {"name": "Persistent", "type": "boolean", "jsonPath": ".spec.allowPersistentIPs"},
            {"name": "Size", "type": "integer", "jsonPath": ".status.size"},
            {"name": "Held", "type": "integer", "jsonPath": ".status.held"},
            {"name": "Free", "type": "integer", "jsonPath": ".status.free"},
        ],
        status={
            "type": "object",
            "description": "Counted by cnidra's pool accountant (docs/ipam.md), not by hand.",
            "properties": {
                k: {"type": "integer", "minimum": 0}
                for k in ("size", "held", "free", "blocks", "poolBlocks")
            },
        },
    )


def block_crd() -> dict[str, Any]:
    spec = {
        "type": "object",
        "required": ["pool", "range", "cidr", "node"],
        "properties": {
            "pool": {"type": "string", "maxLength": POOL_NAME_MAX},
            "range": {"type": "integer", "minimum": 0, "maximum": 1},
            "cidr": {"type": "string", "maxLength": 49},
            "node": {"type": "string", "maxLength": 253},
        },
    }
    return _crd(
        BLOCK_KIND,
        BLOCK_PLURAL,
        ["cniblock"],
        spec,
        [
            {"name": "Pool", "type": "string", "jsonPath": ".spec.pool"},
            {"name": "CIDR", "type": "string", "jsonPath": ".spec.cidr"},
            {"name": "Node", "type": "string", "jsonPath": ".spec.node"},
            {"name": "Leased", "type": "integer", "jsonPath": ".status.leased"},
        ],
        status={
            "type": "object",
            "description": "Written by the block's node, batched (docs/ipam.md).",
            "properties": {"leased": {"type": "integer", "minimum": 0}},
        },
    )


def _crd(
    kind: str,
    plural: str,
    short: list[str],
    spec: dict[str, Any],
    columns: list[dict[str, Any]],
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    properties: dict[str, Any] = {"spec": spec}
    version: dict[str, Any] = {}
    if status is not None:
        properties["status"] = status
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Cluster",
            "names": {
                "kind": kind,
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short,
            },
            "versions": [
                {
                    "name": API_VERSION.split("/")[1],
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "properties": properties,
                        }
                    },
                    **version,
                    "additionalPrinterColumns": [
                        *columns,
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }
