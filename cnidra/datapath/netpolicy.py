"""Network policy enforced with nftables in a network namespace: a pod's table applied, changed,
read back, removed, and its rule counters read. The rules are compiled in
cnidra.api.netpolicy_rules (pure); this module only runs `nft`. docs/network-policy.md.

- **Atomic**: every change of policy is one `nft -f -` batch, which the kernel commits as
  one transaction: set elements changed, or the rules rewritten in place with the sets kept
  (`Ruleset.update_from`); the sets no rule names any more are deleted by a batch after it
  (`Ruleset.leftovers`). No packet ever sees a half-applied policy, nor no policy, and none
  that both policies allow is dropped by the swap. Only a first apply writes the table whole.
- **Reconciled**: with no record of what was applied (a restart), the kernel's table is read
  back (`read_back`) and rewritten in place from it.
- **In the namespace**: `nft` runs as a child started by a thread that entered the namespace
  (cnidra.util.netns: the calling thread never moves; the child keeps the namespace it was
  started in), so one driver process serves every pod.
- **Bounded**: every `nft` has a timeout (NftTimeout past it; the child is killed).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import threading
from dataclasses import dataclass
from os import PathLike, fspath
from typing import Any

from cnidra.api.netpolicy_node import family_of
from cnidra.api.netpolicy_rules import FAMILY, TABLE, Chain, NftSet, Ruleset, delete_script
from cnidra.datapath import bridgeflags
from cnidra.util.netns import setns

NFT = "/usr/sbin/nft"
DEFAULT_TIMEOUT_SECONDS = 5.0


class NftError(Exception):
    """nft refused a batch or could not run; the message says where and what nft said."""


class NftTimeout(NftError):
    """nft did not finish within the timeout (it was killed)."""


class NamespaceGone(NftError):
    """The network namespace is not there (the pod went)."""


def run_nft(
    netns: str | PathLike[str],
    args: tuple[str, ...],
    stdin: str = "",
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> str:
    """`nft <args>` inside the namespace at `netns`, `stdin` fed to it; its output."""
    return run_in(netns, (NFT, *args), stdin, timeout)


def run_in(
    netns: str | PathLike[str],
    argv: tuple[str, ...],
    stdin: str = "",
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> str:
    """`argv` run inside the namespace at `netns` (nft, or ip for a bridge's flags), bounded
    as `run_nft`; NftError when it fails."""
    shown = " ".join((argv[0].rsplit("/", 1)[-1], *argv[1:]))  # "nft list ...", as before
    path = fspath(netns)
    box: dict[str, Any] = {}

    def start() -> None:
        try:
            try:
                target = open(path, "rb")  # noqa: SIM115  (closed by the with below)
            except OSError as exc:
                raise NamespaceGone(f"network namespace {path} is gone ({exc.strerror})") from None
            with target, open("/proc/thread-self/ns/net", "rb") as home:
                setns(target.fileno())
                try:
                    box["proc"] = subprocess.Popen(
                        list(argv),
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                finally:
                    setns(home.fileno())
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=start, name="nft", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise NftTimeout(f"{shown} in {path}: not started within {timeout:g}s")
    if "error" in box:
        error = box["error"]
        if isinstance(error, NftError):
            raise error
        raise NftError(f"{shown} in {path}: {error}") from error
    proc: subprocess.Popen[str] = box["proc"]
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise NftTimeout(f"{shown} in {path}: not done within {timeout:g}s (killed)") from None
    if proc.returncode != 0:
        raise NftError(f"{shown} in {path}: {err.strip() or proc.returncode}")
    return out


def apply(
    netns: str | PathLike[str],
    ruleset: Ruleset,
    previous: Ruleset | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> str:
    """Make the pod's table `ruleset`. `previous` is what was applied last; None (a first
    apply, a resync after a restart) reads the table the kernel has (`read_back`), so a resync
    too changes the table in place. A batch nft refuses because `previous` was not what the
    kernel had (a set element already gone) is tried once more from what the kernel has.

    Returns the batch that changed the policy ("" when nothing changed); the sets only the old
    table had are deleted by a second batch after it (`Ruleset.leftovers`: no rule names them
    by then; left behind when that fails, they are harmless and emptied before any reuse)."""
    if previous is None:
        previous = read_back(netns, ruleset.table, timeout=timeout)
    script = ruleset.update_from(previous)
    if script:
        try:
            run_nft(netns, ("-f", "-"), script, timeout)
        except NftTimeout:
            raise
        except NftError:
            previous = read_back(netns, ruleset.table, timeout=timeout)
            script = ruleset.update_from(previous)
            if script:
                run_nft(netns, ("-f", "-"), script, timeout)
    leftovers = ruleset.leftovers(previous)
    if leftovers:
        run_nft(netns, ("-f", "-"), leftovers, timeout)
    return script


def parse_table(listing: str, table: str = TABLE) -> Ruleset:
    """The table as `nft -j list table` shows it, as a Ruleset good for `update_from`: its
    chains (names and hooks; rules are not read back, so any rewrite replaces them) and its
    sets with their elements in the compiler's spelling."""
    chains: list[Chain] = []
    sets: list[NftSet] = []
    for item in json.loads(listing).get("nftables", []):
        if not isinstance(item, dict):
            continue
        if "chain" in item:
            chain = item["chain"]
            chains.append(Chain(str(chain["name"]), ("<kernel>",), chain.get("hook")))
        elif "set" in item:
            found = item["set"]
            kind = found.get("type")
            type_ = " . ".join(kind) if isinstance(kind, list) else str(kind)
            interval = "interval" in found.get("flags", [])
            elements = frozenset(_element(e, interval) for e in found.get("elem", []))
            sets.append(NftSet(str(found["name"]), type_, interval, elements))
    return Ruleset(tuple(chains), tuple(sets), table)


def _element(value: Any, interval: bool) -> str:
    if isinstance(value, dict) and "elem" in value:  # an element with a counter or comment
        value = value["elem"].get("val")
    if isinstance(value, dict) and "prefix" in value:
        return f"{value['prefix']['addr']}/{value['prefix']['len']}"
    if isinstance(value, dict) and "concat" in value:
        return " . ".join(str(part) for part in value["concat"])
    if interval:  # a single address in an interval set: the compiler writes it as a /32 or /128
        return str(ipaddress.ip_network(str(value)))
    return str(value)


def read_back(
    netns: str | PathLike[str], table: str = TABLE, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> Ruleset | None:
    """The pod's table as the kernel has it; None when it has none."""
    try:
        listing = run_nft(netns, ("-j", "list", "table", FAMILY, table), "", timeout)
    except NftTimeout:
        raise
    except NamespaceGone:
        raise
    except NftError:
        return None
    return parse_table(listing, table)


def remove(
    netns: str | PathLike[str], table: str = TABLE, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> None:
    """Delete the pod's table (nothing when it has none). A namespace already gone is fine:
    the table went with it."""
    try:
        run_nft(netns, ("-f", "-"), delete_script(table, family_of(table)), timeout)
    except NamespaceGone:
        return


@dataclass(frozen=True)
class RuleCounter:
    chain: str
    comment: str
    verdict: str
    packets: int
    bytes: int


def parse_counters(listing: str) -> list[RuleCounter]:
    """The counted rules of `nft -j list table` output, in order."""
    found = []
    for item in json.loads(listing).get("nftables", []):
        rule = item.get("rule") if isinstance(item, dict) else None
        if not isinstance(rule, dict):
            continue
        packets = nbytes = None
        verdict = ""
        for expr in rule.get("expr", []):
            if "counter" in expr and isinstance(expr["counter"], dict):
                packets = int(expr["counter"].get("packets", 0))
                nbytes = int(expr["counter"].get("bytes", 0))
            for word in ("accept", "drop", "return"):
                if word in expr:
                    verdict = word
        if packets is None or nbytes is None:
            continue
        found.append(
            RuleCounter(
                str(rule.get("chain")), str(rule.get("comment", "")), verdict, packets, nbytes
            )
        )
    return found


def counters(
    netns: str | PathLike[str], table: str = TABLE, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> list[RuleCounter]:
    """Every counted rule of the pod's table with its packets and bytes: what each policy rule
    accepted or dropped, and the default denies (for `cnidra node describe` and metrics)."""
    return parse_counters(run_nft(netns, ("-j", "list", "table", FAMILY, table), "", timeout))


def exists(
    netns: str | PathLike[str], table: str = TABLE, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> bool:
    try:
        run_nft(netns, ("list", "table", FAMILY, table), "", timeout)
    except NamespaceGone:
        raise
    except NftTimeout:
        raise
    except NftError:
        return False
    return True


def list_tables(
    netns: str | PathLike[str], *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> list[str]:
    """The names of the `inet` and `bridge` tables in the namespace (a sweep of cnidra's own
    after a restart; a name says its family, `family_of`)."""
    listing = run_nft(netns, ("-j", "list", "tables"), "", timeout)
    return [
        str(item["table"]["name"])
        for item in json.loads(listing).get("nftables", [])
        if isinstance(item, dict)
        and isinstance(item.get("table"), dict)
        and item["table"].get("family") in (FAMILY, "bridge")
    ]


def bridge_nf_call(
    netns: str | PathLike[str], bridge: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> bool:
    """Whether `bridge` hands its IPv4 and IPv6 frames to the `inet` hooks (its own
    nf_call_iptables and nf_call_ip6tables both on). NftError when there is no such bridge."""
    try:
        return bridgeflags.nf_call(netns, bridge)
    except OSError as exc:
        raise NftError(f"bridge {bridge}: {exc}") from exc


def set_bridge_nf_call(
    netns: str | PathLike[str],
    bridge: str,
    on: bool,
    *,
    mark: str = "",
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> None:
    """Turn `bridge`'s nf_call_iptables and nf_call_ip6tables on or off (that bridge alone: not
    the node-wide sysctl, not other bridges). `mark`: the empty `bridge` table that records
    that cnidra turned them on, created before (on) or deleted after (off), so a driver that
    restarts in between still knows. NftError when either fails."""
    if on and mark:
        run_nft(netns, ("add", "table", "bridge", mark), "", timeout)
    try:
        bridgeflags.set_nf_call(netns, bridge, on)
    except OSError as exc:
        raise NftError(f"bridge {bridge}: nf_call_iptables {int(on)}: {exc}") from exc
    if not on and mark:
        run_nft(netns, ("-f", "-"), delete_script(mark, "bridge"), timeout)


def apply_script(
    netns: str | PathLike[str], script: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> None:
    """One `nft -f` batch (a bridge port's anti-spoofing table, written whole)."""
    run_nft(netns, ("-f", "-"), script, timeout)
