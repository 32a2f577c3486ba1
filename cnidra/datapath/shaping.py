"""A rate limit on one interface of a pod, in both directions, inside the pod's own network
namespace: apply (or change) it, read it back, remove it. Through pyroute2's tc messages.

What it builds on the interface `dev` (handles are cnidra's: major 0xcd):

    egress   dev root  htb cd: (default cd:2)
               class cd:1  rate = ceil = the ceiling
                 class cd:2  rate = the reservation, ceil = the ceiling   <- the limit
                   pfifo cd2:  a queue of about 100 ms at the ceiling
    ingress  dev ingress qdisc (or an existing clsact's ingress hook)
               u32 match-all, prio 0xcd: mirred egress redirect to the IFB
             IFB cnifb-<hash of dev's name>, in the same namespace, with the same tree as egress

Why so:
- **IFB, not policing**, for what the pod receives: a policer drops whatever exceeds the rate
  (TCP then sees bursts of loss and reaches less than the rate), an IFB queues and shapes like
  egress. The IFB lives in the pod's namespace, so it goes with the pod and is no host-wide
  object; this kernel (6.18, the test machine's) has no police action at all
  (CONFIG_NET_ACT_POLICE off) and no matchall classifier, so the redirect is a u32 filter
  matching everything.
- **HTB, not TBF**: bursts above the reservation (`Rate.ceil` above `Rate.rate`) need a class
  that borrows up to a ceiling, which TBF cannot; one tree for both modes also makes a change
  between them an in-place change of two classes. HTB borrows only from a parent class, hence
  cd:1 holding the ceiling.
- **Atomic changes**: a first apply replaces the root qdisc in one step; a later one (a new
  rate, a mode) changes the classes in place (`replace-class`), so there is never a moment
  without a limit, and applying the same rate twice leaves the same state.

Every operation runs in a thread of its own that enters the namespace (`cnidra.util.netns`,
the calling thread never moves), bounded by `timeout`: past it, ShapingTimeout (the thread
may still finish; `remove` undoes it). Bad input raises before anything is touched
(InvalidRequest, a ValueError; an invalid `Rate` cannot be made: cnidra.api.bandwidth), a
namespace or interface that is not there raises Gone (NamespaceGone, InterfaceNotFound), and
a first apply that fails part way removes what it made. Callers serialize operations on one
interface (the hook does, per sandbox).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from errno import EEXIST
from os import PathLike, fspath
from typing import Any, TypeVar

from cnidra.api.bandwidth import Rate
from cnidra.util.netns import setns

T = TypeVar("T")

DEFAULT_TIMEOUT_SECONDS = 5.0
MAJOR = 0xCD
ROOT_HANDLE = MAJOR << 16  # cd:
CEILING_CLASS = ROOT_HANDLE | 1  # cd:1
LIMIT_CLASS = ROOT_HANDLE | 2  # cd:2
LEAF_HANDLE = 0xCD2 << 16  # cd2:
TC_H_ROOT = 0xFFFFFFFF
INGRESS_HANDLE = 0xFFFF0000  # ffff:, the ingress qdisc's (and clsact's)
CLSACT_INGRESS = 0xFFFFFFF2  # ffff:fff2, clsact's ingress hook
FILTER_PRIO = MAJOR
ETH_P_ALL = 0x0003
IFB_PREFIX = "cnifb-"
IFB_ALIAS = "cnidra: ingress of "
IFNAME_MAX_BYTES = 15
# tc's default burst is a tick (1 ms at HZ 1000) of the rate and a frame; pyroute2's would
# round to 0 at tens of Gbit/s
BURST_SECONDS = 0.001
BURST_FLOOR_BYTES = 1600
QUANTUM_BYTES = 1514
# the queue of the limited class: about this long at the ceiling, in full-size frames
QUEUE_SECONDS = 0.1
QUEUE_MIN_PACKETS = 64
QUEUE_MAX_PACKETS = 10_000
FRAME_BYTES = 1514
IFB_TXQLEN = 1000  # the kernel's default for an IFB is 32


class ShapingError(Exception):
    """A rate limit could not be applied, read or removed; the message says what and where."""


class InvalidRequest(ShapingError, ValueError):
    """Input that cannot be shaped (a name, a rate, a timeout): nothing was touched."""


class Gone(ShapingError):
    """The namespace or the interface is not there. For `remove` that is the end wanted:
    nothing of the limit is left where nothing is."""


class NamespaceGone(Gone):
    pass


class InterfaceNotFound(Gone):
    pass


class ShapingTimeout(ShapingError, TimeoutError):
    pass


@dataclass(frozen=True)
class TcEntry:
    """A qdisc or class as the kernel dumps it, reduced to what the read-back needs."""

    kind: str
    handle: int
    parent: int
    is_class: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)  # htb: rate, ceil (bytes/s)
    sent_bytes: int = 0
    sent_packets: int = 0
    drops: int = 0
    overlimits: int = 0
    backlog_bytes: int = 0
    queued_packets: int = 0


@dataclass(frozen=True)
class Direction:
    """One direction's limit as configured and its counters since it was applied."""

    rate: int  # bits per second
    ceil: int
    sent_bytes: int
    sent_packets: int
    drops: int
    overlimits: int
    backlog_bytes: int
    queued_packets: int

    @property
    def limit(self) -> Rate:
        return Rate(self.rate, self.ceil)


@dataclass(frozen=True)
class Shaping:
    """An interface's limit in both directions (None: that direction is not cnidra's)."""

    interface: str
    egress: Direction | None
    ingress: Direction | None
    ifb: str | None

    @property
    def complete(self) -> bool:
        return self.egress is not None and self.ingress is not None


# ------------------------------------------------------------------ pure parts


def ifb_name(interface: str) -> str:
    """The IFB that shapes what `interface` receives: 15 bytes, the same for the same name."""
    digest = hashlib.sha256(interface.encode()).hexdigest()
    return (IFB_PREFIX + digest)[:IFNAME_MAX_BYTES]


def check_interface(interface: object) -> str:
    if not isinstance(interface, str) or not interface:
        raise InvalidRequest(f"interface must be a non-empty name, got {interface!r}")
    if (
        len(interface.encode()) > IFNAME_MAX_BYTES
        or "/" in interface
        or interface.strip() != (interface)
    ):
        raise InvalidRequest(
            f"interface {interface!r} is not a link name: at most {IFNAME_MAX_BYTES} bytes, "
            "no '/' or spaces"
        )
    if interface == "lo":
        raise InvalidRequest("interface 'lo' is the namespace's loopback; shape a pod interface")
    if interface.startswith(IFB_PREFIX):
        raise InvalidRequest(
            f"interface {interface!r} is cnidra's IFB; shape the interface it serves"
        )
    return interface


def check_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise InvalidRequest(f"timeout must be a number of seconds above 0, got {timeout!r}")
    return float(timeout)


def queue_packets(ceil_bps: int) -> int:
    packets = int(ceil_bps / 8 * QUEUE_SECONDS / FRAME_BYTES)
    return max(QUEUE_MIN_PACKETS, min(QUEUE_MAX_PACKETS, packets))


def burst_bytes(bps: int) -> int:
    return int(bps / 8 * BURST_SECONDS) + BURST_FLOOR_BYTES


def direction(entries: Sequence[TcEntry]) -> Direction | None:
    """cnidra's limit among one device's qdiscs and classes: its root HTB and limited class;
    None when the root is not cnidra's (another qdisc, or none)."""
    root = next((e for e in entries if e.parent == TC_H_ROOT and not e.is_class), None)
    if root is None or root.kind != "htb" or root.handle != ROOT_HANDLE:
        return None
    limit = next((e for e in entries if e.is_class and e.handle == LIMIT_CLASS), None)
    if limit is None or limit.kind != "htb":
        return None
    rate = int(limit.options.get("rate", 0)) * 8
    ceil = int(limit.options.get("ceil", 0)) * 8
    return Direction(
        rate=rate,
        ceil=max(ceil, rate),
        sent_bytes=limit.sent_bytes,
        sent_packets=limit.sent_packets,
        drops=limit.drops,
        overlimits=limit.overlimits,
        backlog_bytes=limit.backlog_bytes,
        queued_packets=limit.queued_packets,
    )


def entry_of(msg: Any, is_class: bool = False) -> TcEntry:
    """A pyroute2 tc message (RTM_NEWQDISC or RTM_NEWTCLASS) as a TcEntry."""
    kind = msg.get_attr("TCA_KIND") or ""
    options: dict[str, Any] = {}
    opts = msg.get_attr("TCA_OPTIONS")
    if kind == "htb" and opts is not None and hasattr(opts, "get_attr"):
        parms = opts.get_attr("TCA_HTB_PARMS")
        if parms is not None:
            options["rate"] = opts.get_attr("TCA_HTB_RATE64") or parms["rate"]
            options["ceil"] = opts.get_attr("TCA_HTB_CEIL64") or parms["ceil"]
    basic: Mapping[str, Any] = {}
    queue: Mapping[str, Any] = {}
    stats2 = msg.get_attr("TCA_STATS2")
    if stats2 is not None:
        basic = stats2.get_attr("TCA_STATS_BASIC") or {}
        queue = stats2.get_attr("TCA_STATS_QUEUE") or {}
    return TcEntry(
        kind=kind,
        handle=int(msg["handle"]),
        parent=int(msg["parent"]),
        is_class=is_class,
        options=options,
        sent_bytes=int(basic.get("bytes", 0)),
        sent_packets=int(basic.get("packets", 0)),
        drops=int(queue.get("drops", 0)),
        overlimits=int(queue.get("overlimits", 0)),
        backlog_bytes=int(queue.get("backlog", 0)),
        queued_packets=int(queue.get("qlen", 0)),
    )


# ------------------------------------------------------------------ in the namespace


def _in_namespace(
    netns: str | PathLike[str], what: str, timeout: float, work: Callable[[Any], T]
) -> T:
    """`work(ipr)` with a netlink socket of the namespace at `netns`, in a new thread, within
    `timeout` seconds."""
    path = fspath(netns)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            from pyroute2 import IPRoute

            try:
                target = open(path, "rb")  # noqa: SIM115  (closed by the with below)
            except OSError as exc:
                raise NamespaceGone(
                    f"{what}: network namespace {path} is gone ({exc.strerror})"
                ) from None
            with target, open("/proc/thread-self/ns/net", "rb") as home:
                try:
                    setns(target.fileno())
                except OSError as exc:
                    raise NamespaceGone(
                        f"{what}: {path} is not a network namespace one can enter ({exc})"
                    ) from None
                try:
                    ipr = IPRoute()  # its socket belongs to the namespace it is made in
                finally:
                    setns(home.fileno())
            try:
                box["value"] = work(ipr)
            finally:
                ipr.close()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name="shaping", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ShapingTimeout(f"{what} in {path}: not done within {timeout:g}s")
    if "error" in box:
        error = box["error"]
        if isinstance(error, ShapingError):
            raise error
        raise ShapingError(f"{what} in {path}: {_said(error)}") from error
    value: T = box["value"]
    return value


def _said(error: BaseException) -> str:
    args: tuple[Any, ...] = tuple(getattr(error, "args", ()))
    if len(args) == 2 and isinstance(args[0], int):
        return f"{args[1]} (errno {args[0]})"
    return str(error) or type(error).__name__


def _index(ipr: Any, name: str) -> int | None:
    found = ipr.link_lookup(ifname=name)
    return int(found[0]) if found else None


def _names(ipr: Any) -> list[str]:
    return sorted(str(link.get_attr("IFLA_IFNAME")) for link in ipr.get_links())


def _require(ipr: Any, interface: str, netns: str) -> int:
    index = _index(ipr, interface)
    if index is None:
        names = [n for n in _names(ipr) if n != "lo" and not n.startswith(IFB_PREFIX)]
        raise InterfaceNotFound(
            f"interface {interface!r} is not in network namespace {netns}; its interfaces: "
            + (", ".join(names) or "none but lo")
        )
    return index


def _entries(ipr: Any, index: int) -> list[TcEntry]:
    qdiscs = [entry_of(m) for m in ipr.get_qdiscs(index=index) if m["index"] == index]
    classes = [entry_of(m, is_class=True) for m in ipr.get_classes(index=index)]
    return qdiscs + [c for c in classes if c.kind]


def _ifb(ipr: Any, interface: str, strict: bool = True) -> tuple[int | None, str]:
    """The IFB of `interface` if it exists and is cnidra's. A link of another kind or owner
    under that name is left alone: InvalidRequest if `strict`, else as if absent."""
    name = ifb_name(interface)
    index = _index(ipr, name)
    if index is None:
        return None, name
    link = ipr.get_links(index)[0]
    info = link.get_attr("IFLA_LINKINFO")
    kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
    alias = link.get_attr("IFLA_IFALIAS") or ""
    if kind != "ifb" or not alias.startswith(IFB_ALIAS):
        if not strict:
            return None, name
        raise InvalidRequest(
            f"link {name!r}, where cnidra puts the IFB of {interface!r}, is not cnidra's (kind "
            f"{kind or 'unknown'}, alias {alias!r}); it is left alone"
        )
    return index, name


def _shape_device(ipr: Any, index: int, limit: Rate) -> None:
    """The HTB tree on one device: the root made (or kept) and the classes changed in place."""
    root = next((e for e in _entries(ipr, index) if e.parent == TC_H_ROOT and not e.is_class), None)
    if root is None or root.kind != "htb" or root.handle != ROOT_HANDLE:
        # one step from whatever was there (noqueue, pfifo_fast, another's) to ours
        ipr.tc("replace", "htb", index, ROOT_HANDLE, parent=TC_H_ROOT, default=LIMIT_CLASS & 0xFFFF)
    # the ceiling first, then the limited class: each change is atomic, and in between the
    # class is held to its old limit or the new one, never none
    _htb_class(ipr, index, CEILING_CLASS, ROOT_HANDLE, limit.ceil, limit.ceil)
    _htb_class(ipr, index, LIMIT_CLASS, CEILING_CLASS, limit.rate, limit.ceil)
    ipr.tc(
        "replace", "pfifo", index, LEAF_HANDLE, parent=LIMIT_CLASS, limit=queue_packets(limit.ceil)
    )


def _htb_class(ipr: Any, index: int, handle: int, parent: int, rate: int, ceil: int) -> None:
    """An HTB class at `rate` bit/s that may borrow up to `ceil` (replaced in place)."""
    ipr.tc(
        "replace-class",
        "htb",
        index,
        handle,
        parent=parent,
        rate=rate // 8,
        ceil=ceil // 8,
        burst=burst_bytes(rate),
        cburst=burst_bytes(ceil),
        quantum=QUANTUM_BYTES,
    )


def _ingress_parent(ipr: Any, index: int, create: bool) -> int | None:
    """Where the redirect filter hangs: the ingress qdisc (made if `create`), or the ingress
    hook of a clsact someone else put there (the two exclude each other)."""
    for entry in _entries(ipr, index):
        if entry.handle == INGRESS_HANDLE and entry.kind == "clsact":
            return CLSACT_INGRESS
        if entry.handle == INGRESS_HANDLE and entry.kind == "ingress":
            return INGRESS_HANDLE
    if not create:
        return None
    ipr.tc("add", "ingress", index, INGRESS_HANDLE)
    return INGRESS_HANDLE


def _redirect_target(ipr: Any, index: int, parent: int) -> int | None:
    """The device cnidra's filter redirects `index`'s ingress to (None: no such filter)."""
    for msg in ipr.get_filters(index=index, parent=parent):
        if msg["info"] >> 16 != FILTER_PRIO:
            continue
        options = msg.get_attr("TCA_OPTIONS")
        actions = options.get_attr("TCA_U32_ACT") if options is not None else None
        if actions is None:
            continue
        for _, action in actions["attrs"]:
            parms = action.get_attr("TCA_ACT_OPTIONS")
            mirred = parms.get_attr("TCA_MIRRED_PARMS") if parms is not None else None
            if mirred is not None:
                return int(mirred["ifindex"])
    return None


def _redirect(ipr: Any, index: int, ifb: int) -> None:
    parent = _ingress_parent(ipr, index, create=True)
    assert parent is not None
    target = _redirect_target(ipr, index, parent)
    if target == ifb:
        return
    if target is not None:  # to an IFB that is no more (deleted by hand): a u32 filter added
        # beside it would come second, after the stale one that drops everything
        ipr.tc("del-filter", index=index, parent=parent, prio=FILTER_PRIO, protocol=ETH_P_ALL)
    ipr.tc(
        "add-filter",
        "u32",
        index,
        parent=parent,
        prio=FILTER_PRIO,
        protocol=ETH_P_ALL,
        target=0x1,
        keys=["0x0/0x0+0"],
        action=[{"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": ifb}],
    )


def _make_ifb(ipr: Any, interface: str) -> int:
    index, name = _ifb(ipr, interface)
    if index is None:
        try:
            ipr.link("add", ifname=name, kind="ifb", txqlen=IFB_TXQLEN)
        except Exception as exc:  # made meanwhile by another caller: taken below if it is ours
            if getattr(exc, "code", None) != EEXIST:
                raise
        else:
            made = _index(ipr, name)
            try:  # the kernel takes an alias on a change only, not with the new link
                ipr.link("set", index=made, ifalias=IFB_ALIAS + interface)
            except BaseException:
                ipr.link("del", index=made)
                raise
        index, name = _ifb(ipr, interface)
        assert index is not None
    ipr.link("set", index=index, state="up")
    return index


def _unshape(ipr: Any, interface: str) -> bool:
    """Everything of cnidra's limit on `interface` gone: the root HTB, the redirect filter, an
    ingress qdisc left without filters, the IFB. Whether anything was there."""
    removed = False
    index = _index(ipr, interface)
    ifb_index, _ = _ifb(ipr, interface, strict=False)
    if index is not None:
        if direction(_entries(ipr, index)) is not None:
            ipr.tc("del", "htb", index, ROOT_HANDLE, parent=TC_H_ROOT)
            removed = True
        parent = _ingress_parent(ipr, index, create=False)
        if parent is not None:
            if _redirect_target(ipr, index, parent) is not None:
                ipr.tc(
                    "del-filter", index=index, parent=parent, prio=FILTER_PRIO, protocol=ETH_P_ALL
                )
                removed = True
            left = [m for m in ipr.get_filters(index=index, parent=parent) if m["info"] >> 16]
            if parent == INGRESS_HANDLE and not left:
                ipr.tc("del", "ingress", index, INGRESS_HANDLE)
    if ifb_index is not None:  # after the filter: a redirect to a deleted IFB drops
        ipr.link("del", index=ifb_index)
        removed = True
    return removed


def _read(ipr: Any, interface: str) -> Shaping | None:
    index = _index(ipr, interface)
    if index is None:
        return None
    egress = direction(_entries(ipr, index))
    ingress = None
    ifb_index, ifb = _ifb(ipr, interface, strict=False)
    if ifb_index is not None:
        parent = _ingress_parent(ipr, index, create=False)
        if parent is not None and _redirect_target(ipr, index, parent) == ifb_index:
            ingress = direction(_entries(ipr, ifb_index))
    return Shaping(interface, egress, ingress, ifb if ifb_index is not None else None)


# ------------------------------------------------------------------ the operations


def apply(
    netns: str | PathLike[str],
    interface: str,
    limit: Rate,
    *,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> Shaping:
    """Hold `interface` in the namespace at `netns` to `limit` in both directions: set it up,
    or change it in place. Returns what is then configured (its counters included)."""
    check_interface(interface)
    timeout = check_timeout(timeout)
    if not isinstance(limit, Rate):
        raise InvalidRequest(f"limit must be a cnidra.api.bandwidth.Rate, got {limit!r}")

    def work(ipr: Any) -> Shaping:
        index = _require(ipr, interface, fspath(netns))
        _ifb(ipr, interface)  # a foreign link under the IFB's name: refused before any change
        before = _read(ipr, interface)
        try:
            ifb = _make_ifb(ipr, interface)
            _shape_device(ipr, ifb, limit)
            _shape_device(ipr, index, limit)
            _redirect(ipr, index, ifb)
        except BaseException as error:
            if before is None or (before.egress is None and before.ingress is None):
                try:  # a first apply leaves nothing when it fails
                    _unshape(ipr, interface)
                except Exception as cleanup:
                    error.add_note(f"undoing it failed too, and left part of it: {cleanup!r}")
            raise
        shaped = _read(ipr, interface)
        assert shaped is not None and shaped.complete
        return shaped

    return _in_namespace(netns, f"shaping {interface} to {limit}", timeout, work)


def remove(
    netns: str | PathLike[str], interface: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> bool:
    """Remove cnidra's limit from `interface` (its IFB included), even where the interface
    itself is gone: whether there was anything. Gone when neither the interface nor its IFB is
    there (or the namespace is gone): a caller that only wants it undone takes that as done."""
    check_interface(interface)
    timeout = check_timeout(timeout)

    def work(ipr: Any) -> bool:
        if _index(ipr, interface) is None and _index(ipr, ifb_name(interface)) is None:
            _require(ipr, interface, fspath(netns))
        return _unshape(ipr, interface)

    return _in_namespace(netns, f"removing the limit of {interface}", timeout, work)


def read(
    netns: str | PathLike[str], interface: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> Shaping:
    """The limit configured on `interface` and its counters; egress and ingress None where
    cnidra's limit is not there."""
    check_interface(interface)
    timeout = check_timeout(timeout)

    def work(ipr: Any) -> Shaping:
        _require(ipr, interface, fspath(netns))
        shaped = _read(ipr, interface)
        assert shaped is not None
        return shaped

    return _in_namespace(netns, f"reading the limit of {interface}", timeout, work)


def read_many(
    netns: str | PathLike[str],
    interfaces: Iterable[str],
    *,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> dict[str, Shaping]:
    """`read` of several interfaces of one namespace with one entry into it (a pod's, for node
    describe and the metrics); an interface that is not there is left out."""
    names = [check_interface(i) for i in interfaces]
    timeout = check_timeout(timeout)

    def work(ipr: Any) -> dict[str, Shaping]:
        found = {}
        for name in names:
            shaped = _read(ipr, name)
            if shaped is not None:
                found[name] = shaped
        return found

    return _in_namespace(netns, "reading limits", timeout, work)
