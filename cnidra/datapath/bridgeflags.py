"""A bridge's own br_netfilter switches, read and set over rtnetlink in a network namespace:
`nf_call_iptables` and `nf_call_ip6tables` (IFLA_BR_NF_CALL_IPTABLES, _IP6TABLES), what
`ip link set BR type bridge nf_call_iptables 1` sets. With them on, that bridge's IPv4 and IPv6
frames pass the namespace's `inet` prerouting, forward and postrouting hooks (with conntrack),
whatever the node-wide sysctl `net.bridge.bridge-nf-call-iptables` says, and no other bridge's
do: the host side of network policy for pods on a bridge (docs/network-policy.md).

By netlink rather than `ip`: the driver's image has nftables but no iproute2. The socket is made
by a thread that entered the namespace (a netlink socket stays in the namespace it was made in),
so the caller never moves."""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
from collections.abc import Iterator
from os import PathLike
from typing import Any

from cnidra.util.netns import entered

# the layouts of linux/netlink.h, linux/rtnetlink.h and linux/if_link.h this needs (the link
# dumps' reader, cnidra.inventory.netlink, is of a higher layer than the datapath)
NETLINK_ROUTE = 0
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 2
RTM_NEWLINK, RTM_GETLINK = 16, 18
IFLA_IFNAME, IFLA_LINKINFO = 3, 18
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
NLA_F_NESTED = 0x8000
_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_ATTR = struct.Struct("=HH")  # rtattr: len, type
IFLA_BR_NF_CALL_IPTABLES, IFLA_BR_NF_CALL_IP6TABLES = 36, 37  # u8s in a bridge's INFO_DATA
TIMEOUT = 5.0


class BridgeFlagError(OSError):
    """The bridge is not there, is no bridge, or the kernel refused the change."""


def messages(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(type, body's start, end) of each message of one datagram."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _flags, _seq, _pid = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size or offset + length > len(data):
            raise BridgeFlagError(errno.EBADMSG, f"a message of length {length} at {offset}")
        yield kind, offset + _HEADER.size, offset + length
        offset += (length + 3) & ~3


def _attributes(data: bytes, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(type, value) of each attribute in data[start:end]."""
    while start + _ATTR.size <= end:
        length, kind = _ATTR.unpack_from(data, start)
        if length < _ATTR.size or start + length > end:
            raise BridgeFlagError(errno.EBADMSG, f"an attribute of length {length} at {start}")
        yield kind & _TYPE_MASK, data[start + _ATTR.size : start + length]
        start += (length + 3) & ~3


def _text(value: bytes) -> str:
    return value.split(b"\0", 1)[0].decode("utf-8", "replace")


def _attr(kind: int, value: bytes) -> bytes:
    length = _ATTR.size + len(value)
    return _ATTR.pack(length, kind) + value + b"\0" * ((4 - length % 4) % 4)


def _socket_in(netns: str | PathLike[str]) -> socket.socket:
    """A netlink socket of the namespace at `netns`, made by a thread that entered it."""
    box: dict[str, Any] = {}

    def make() -> None:
        try:
            with entered(netns):
                box["sock"] = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=make, name="bridgeflags", daemon=True)
    thread.start()
    thread.join(TIMEOUT)
    if "error" in box:
        raise BridgeFlagError(f"network namespace {os.fspath(netns)}: {box['error']}")
    if "sock" not in box:
        raise BridgeFlagError(f"network namespace {os.fspath(netns)}: not entered in time")
    sock: socket.socket = box["sock"]
    sock.settimeout(TIMEOUT)
    return sock


def _ask(sock: socket.socket, kind: int, flags: int, body: bytes) -> bytes:
    """One request and the kernel's answer (its RTM_NEWLINK, or an ack); BridgeFlagError for an
    error answer."""
    sock.bind((0, 0))
    sock.send(_HEADER.pack(_HEADER.size + len(body), kind, NLM_F_REQUEST | flags, 1, 0) + body)
    data = sock.recv(1 << 16)
    for msg_kind, start, _end in messages(data):
        if msg_kind == NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, start)[0]
            if code:
                raise BridgeFlagError(code, os.strerror(code))
    return data


def _info_data(data: bytes) -> tuple[int, str, dict[int, bytes]]:
    """(index, kind, IFLA_INFO_DATA attributes) of the link in an RTM_NEWLINK answer."""
    for msg_kind, start, end in messages(data):
        if msg_kind != RTM_NEWLINK:
            continue
        index = _IFINFO.unpack_from(data, start)[2]
        kind, info = "", {}
        for attr, value in _attributes(data, start + _IFINFO.size, end):
            if attr != IFLA_LINKINFO:
                continue
            for sub, sub_value in _attributes(value, 0, len(value)):
                if sub == IFLA_INFO_KIND:
                    kind = _text(sub_value)
                elif sub == IFLA_INFO_DATA:
                    info = dict(_attributes(sub_value, 0, len(sub_value)))
        return index, kind, info
    raise BridgeFlagError(errno.ENODEV, "no link in the answer")


def _bridge(sock: socket.socket, bridge: str) -> tuple[int, dict[int, bytes]]:
    body = _IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(IFLA_IFNAME, bridge.encode() + b"\0")
    try:
        index, kind, info = _info_data(_ask(sock, RTM_GETLINK, 0, body))
    except BridgeFlagError as exc:
        raise BridgeFlagError(exc.errno, f"link {bridge}: {exc.strerror}") from None
    if kind != "bridge":
        raise BridgeFlagError(errno.EINVAL, f"link {bridge} is a {kind or 'plain'} link, no bridge")
    return index, info


def nf_call(netns: str | PathLike[str], bridge: str) -> bool:
    """Whether `bridge` hands both its IPv4 and IPv6 frames to the `inet` hooks."""
    with _socket_in(netns) as sock:
        _index, info = _bridge(sock, bridge)
    flags = [info.get(a, b"\0")[:1] for a in (IFLA_BR_NF_CALL_IPTABLES, IFLA_BR_NF_CALL_IP6TABLES)]
    return all(f not in (b"", b"\0") for f in flags)


def set_nf_call(netns: str | PathLike[str], bridge: str, on: bool) -> None:
    """Turn `bridge`'s nf_call_iptables and nf_call_ip6tables on or off, nothing else."""
    value = struct.pack("=B", 1 if on else 0)
    with _socket_in(netns) as sock:
        index, _info = _bridge(sock, bridge)
    data = _attr(IFLA_BR_NF_CALL_IPTABLES, value) + _attr(IFLA_BR_NF_CALL_IP6TABLES, value)
    linkinfo = _attr(IFLA_INFO_KIND, b"bridge") + _attr(IFLA_INFO_DATA | NLA_F_NESTED, data)
    body = _IFINFO.pack(socket.AF_UNSPEC, 0, index, 0, 0) + _attr(
        IFLA_LINKINFO | NLA_F_NESTED, linkinfo
    )
    with _socket_in(netns) as sock:
        _ask(sock, RTM_NEWLINK, NLM_F_ACK, body)
