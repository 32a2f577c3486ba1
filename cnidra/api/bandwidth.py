"""Bandwidth a claim reserved, as the rate limit cnidra enforces on its interface. Pure: no I/O.

A link's speed is published as consumable capacity `bandwidth` (cnidra.inventory.slices), in
bits per second as a Kubernetes quantity (`10000M` for a 10 Gbit/s link), so a claim can ask
for `capacity.requests: {bandwidth: 1G}` and the scheduler places it where the link has room.
What the allocation granted (its result's `consumedCapacity.bandwidth`) is enforced by the
driver in both directions, never by tenant config; the DeviceClass's CNIPolicy decides, in
`bandwidth` (`BandwidthRules`), what a claim that reserved nothing gets and whether bursts
above the reservation are allowed. `enforced_rate` is that decision; cnidra.datapath.shaping
applies it.

A claim that reserved nothing gets, by default (`whenUnreserved: Leftover`), an even share of
what the link's reservations leave (`leftover_share`), so unreserved pods never crowd reserved
ones; the share depends on the other interfaces on the link, so the node decides it again as
they come and go (cnidra.nri.bandwidth), from the `Terms` kept with each attachment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# the capacity a link device publishes its speed as (cnidra.inventory.slices)
BANDWIDTH_CAPACITY = "bandwidth"
UNLIMITED = "Unlimited"
LEFTOVER = "Leftover"
UNRESERVED_FORMS = f"{LEFTOVER!r}, {UNLIMITED!r} or a rate"
# the least a claim that reserved nothing gets under Leftover, even on a link reserved whole:
# its interface keeps working (what such claims together may then take from reservations is
# this times their number)
SHARE_FLOOR_BPS = 1_000_000
BURST_ALLOWED = "Allowed"
BURST_DENIED = "Denied"
# tc counts rates in whole bytes per second: 8 bit/s is the least it can hold, and every rate
# is rounded up to a whole byte per second
MIN_RATE_BPS = 8
# far above any link, far below what the kernel's 64-bit rates hold
MAX_RATE_BPS = 100 * 10**12
# a Kubernetes quantity: sign, number, then a binary-SI or decimal-SI suffix or an exponent
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
)
_MULTIPLIERS: Mapping[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal(10) ** -9,
    "u": Decimal(10) ** -6,
    "m": Decimal(10) ** -3,
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_MAX_EXPONENT = 30  # a quantity beyond 10^30 is no rate; refused before Decimal grows it
QUANTITY_FORMS = "a number with an optional suffix (k, M, G, T, Ki, Mi, Gi, e6, ...)"


class QuantityError(ValueError):
    """Text that is not a Kubernetes quantity, or a rate outside what cnidra enforces."""


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (`100M`, `1Gi`, `1.5G`, `25e6`, or an integer) as an exact
    number; QuantityError names the text and the forms allowed."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise QuantityError(f"{value!r} is not a quantity: {QUANTITY_FORMS}")
    if isinstance(value, int):
        return Decimal(value)
    match = _QUANTITY.match(value)
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity: {QUANTITY_FORMS}")
    number = Decimal(match.group("number"))
    suffix = match.group("suffix") or ""
    if suffix not in _MULTIPLIERS:  # an exponent: e6, E-3
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"{value!r}: exponent {exponent} is out of range")
        return number.scaleb(exponent)
    return number * _MULTIPLIERS[suffix]


def rate_bps(value: Any, what: str = "a rate") -> int:
    """A quantity as a rate in bits per second that tc can hold: whole bytes per second
    (rounded up), from MIN_RATE_BPS to MAX_RATE_BPS; QuantityError says which are allowed."""
    try:
        number = parse_quantity(value)
    except QuantityError as exc:
        raise QuantityError(f"{what}: {exc}") from None
    if number <= 0:
        raise QuantityError(
            f"{what} must be above 0 (bits per second, e.g. 100M or 1G), got {value!r}"
        )
    if number > MAX_RATE_BPS:
        raise QuantityError(f"{what} must be at most 100T (bits per second), got {value!r}")
    try:
        whole_bytes = (number / 8).to_integral_value(rounding=ROUND_CEILING)
    except InvalidOperation:  # pragma: no cover: bounded above
        raise QuantityError(f"{what}: {value!r} is out of range") from None
    return max(int(whole_bytes) * 8, MIN_RATE_BPS)


def format_rate(bps: int) -> str:
    """A rate as the shortest exact quantity with a decimal suffix: 20000000 -> `20M`."""
    for suffix, factor in (("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if bps >= factor and bps % factor == 0:
            return f"{bps // factor}{suffix}"
    return str(bps)


@dataclass(frozen=True)
class Rate:
    """A rate limit in bits per second, the same in both directions: `rate` is what the claim
    is held to (its reservation), `ceil` the most it may reach by borrowing while the link has
    room (equal to `rate`: no bursts)."""

    rate: int
    ceil: int

    def __post_init__(self) -> None:
        for name, value in (("rate", self.rate), ("ceil", self.ceil)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise QuantityError(f"{name} must be an integer number of bits per second")
            if not MIN_RATE_BPS <= value <= MAX_RATE_BPS:
                raise QuantityError(
                    f"{name} must be {MIN_RATE_BPS} (a byte a second) to "
                    f"{format_rate(MAX_RATE_BPS)} bits per second, got {value}"
                )
            if value % 8:
                raise QuantityError(f"{name} must be whole bytes per second, got {value} bit/s")
        if self.ceil < self.rate:
            raise QuantityError(f"ceil ({self.ceil}) must not be below rate ({self.rate})")

    @property
    def burst(self) -> bool:
        return self.ceil > self.rate

    def __str__(self) -> str:
        shown = f"{format_rate(self.rate)}bit/s"
        return f"{shown} (bursts to {format_rate(self.ceil)}bit/s)" if self.burst else shown


class BandwidthRules(BaseModel):
    """The CNIPolicy's `bandwidth`: what a claim of the class is held to. The reservation is
    always enforced; these say what a claim that reserved nothing gets and whether bursts
    above a reservation are allowed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Leftover (the default): an even share of what the reservations on its link leave;
    # Unlimited: no limit (such a claim can crowd reserved ones); or a quantity (bits per
    # second): the rate a claim that reserved no bandwidth is held to, as if it had reserved it
    when_unreserved: str | int = Field(LEFTOVER, alias="whenUnreserved")
    # Allowed: up to burstCeiling (or the link's speed) while the link has room; Denied: never
    # above the reservation
    burst: Literal["Allowed", "Denied"] = "Denied"
    # the most a burst reaches (a quantity, bits per second); unset: the link's speed
    burst_ceiling: str | int | None = Field(None, alias="burstCeiling")

    @field_validator("when_unreserved")
    @classmethod
    def _unreserved(cls, value: str | int) -> str | int:
        if value not in (UNLIMITED, LEFTOVER):
            try:
                rate_bps(value, "whenUnreserved")
            except QuantityError as exc:
                raise ValueError(f"{exc}; or {LEFTOVER!r} or {UNLIMITED!r}") from None
        return value

    @field_validator("burst_ceiling")
    @classmethod
    def _ceiling(cls, value: str | int | None) -> str | int | None:
        if value is not None:
            rate_bps(value, "burstCeiling")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> BandwidthRules:
        if self.burst_ceiling is not None and self.burst != BURST_ALLOWED:
            raise ValueError("burstCeiling needs burst: Allowed (with Denied nothing bursts)")
        floor = self.floor_bps
        ceiling = self.ceiling_bps
        if floor is not None and ceiling is not None and floor > ceiling:
            raise ValueError(
                f"whenUnreserved ({self.when_unreserved}) is above burstCeiling "
                f"({self.burst_ceiling}): a ceiling below the rate would never be reached"
            )
        return self

    @property
    def floor_bps(self) -> int | None:
        """The fixed rate of a claim that reserved nothing; None: unlimited or a share."""
        if self.when_unreserved in (UNLIMITED, LEFTOVER):
            return None
        return rate_bps(self.when_unreserved, "whenUnreserved")

    @property
    def shares_leftover(self) -> bool:
        """A claim that reserved nothing gets a share of what the link's reservations leave."""
        return self.when_unreserved == LEFTOVER

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)

    @property
    def ceiling_bps(self) -> int | None:
        return None if self.burst_ceiling is None else rate_bps(self.burst_ceiling, "burstCeiling")


DEFAULT_RULES = BandwidthRules.model_validate({})


def granted_bps(consumed_capacity: Mapping[str, Any] | None) -> int | None:
    """The bandwidth an allocation result granted (its `consumedCapacity`), in bits per second;
    None when it reserved none (absent, or 0: the capacity's default)."""
    if not consumed_capacity or consumed_capacity.get(BANDWIDTH_CAPACITY) is None:
        return None
    value = consumed_capacity[BANDWIDTH_CAPACITY]
    if parse_quantity(value) == 0:
        return None
    return rate_bps(value, f"consumedCapacity.{BANDWIDTH_CAPACITY}")


def leftover_share(link_bps: int | None, reserved_bps: int, sharers: int) -> int | None:
    """What each of `sharers` interfaces that reserved nothing on one link gets under
    `Leftover`: the link's speed less what the interfaces on it reserved, split evenly, in
    whole bytes per second and at least SHARE_FLOOR_BPS. None where the link's speed is not
    known (it publishes no `bandwidth`, so nothing on it is reserved: no limit)."""
    if not link_bps or link_bps <= 0:
        return None
    left = max(link_bps - max(reserved_bps, 0), 0) // max(sharers, 1)
    return min(max(left // 8 * 8, SHARE_FLOOR_BPS), MAX_RATE_BPS)


def enforced_rate(
    granted_capacity: Mapping[str, Any] | None,
    policy: BandwidthRules | None,
    link_speed: int | None,
    share: int | None = None,
) -> Rate | None:
    """The rate limit a device of a claim is held to, in both directions; None: none.

    `granted_capacity` is the allocation result's `consumedCapacity` (the scheduler's grant;
    None or without `bandwidth`: nothing reserved), `policy` the class's CNIPolicy's
    `bandwidth` (None: the defaults, whenUnreserved Unlimited and burst Denied), `link_speed`
    the allocated link's speed in bits per second (None: not known). A claim that reserved
    nothing gets the policy's whenUnreserved: Leftover, `share` (its `leftover_share`; None:
    no limit), which it never bursts above (it is all the link has left); Unlimited, no limit;
    a rate, that rate. Bursts, where allowed,
    reach the policy's burstCeiling, else the link's speed, else are not bounded by cnidra
    (MAX_RATE_BPS: the link itself bounds them). QuantityError for a grant that is no rate."""
    rules = policy or DEFAULT_RULES
    return decide(granted_bps(granted_capacity), rules, link_speed, share)


def decide(
    granted: int | None, rules: BandwidthRules, link_speed: int | None, share: int | None = None
) -> Rate | None:
    """`enforced_rate` of a grant already in bits per second (None: nothing reserved).
    `share` is also what a claim that reserved and may burst borrows at most: its even share
    of what the link's grants leave (None: not known; it bursts to the ceiling alone)."""
    rate = granted
    if rate is None and rules.shares_leftover:
        return None if share is None else Rate(share, share)
    if rate is None:
        rate = rules.floor_bps
    if rate is None:
        return None
    if rules.burst != BURST_ALLOWED:
        return Rate(rate, rate)
    ceiling = rules.ceiling_bps
    if ceiling is None and link_speed:
        ceiling = min(max(link_speed // 8 * 8, MIN_RATE_BPS), MAX_RATE_BPS)
    if ceiling is None:
        ceiling = MAX_RATE_BPS
    if share is not None and granted is not None:  # bursts take only what nobody reserved
        ceiling = min(ceiling, rate + share)
    return Rate(rate, max(rate, ceiling))


@dataclass(frozen=True)
class Terms:
    """What an interface's rate limit is decided from, kept with its attachment, so that the
    node can decide it again while the pod runs: when the class's rules change, and, for a
    claim that reserved nothing under Leftover, as reservations on its link come and go. The
    grant itself cannot change: Kubernetes refuses any change to a claim's
    `status.allocation` once set (cnidra.nri.bandwidth)."""

    granted: int | None  # bit/s the allocation reserved; None: nothing
    link: int | None  # the link's speed in bit/s as prepare read it; None: not known
    rules: BandwidthRules  # the class's rules as the allocation copied them
    device_class: str = ""  # the DeviceClass of the request, whose later rules the node follows

    def decide(self, rules: BandwidthRules | None = None, share: int | None = None) -> Rate | None:
        """The limit under `rules` (None: the allocation's) with `share` for Leftover."""
        return decide(self.granted, self.rules if rules is None else rules, self.link, share)

    def shares(self, rules: BandwidthRules | None = None) -> bool:
        """Whether the interface takes a share of what its link's reservations leave."""
        return self.granted is None and (self.rules if rules is None else rules).shares_leftover

    def borrows(self, rules: BandwidthRules | None = None) -> bool:
        """Whether the interface reserved and may burst: it borrows from what the link's
        reservations leave, an even share of it beside those that reserved nothing."""
        return (
            self.granted is not None
            and (self.rules if rules is None else rules).burst == BURST_ALLOWED
        )

    def takes(self, rules: BandwidthRules | None = None) -> bool:
        """Whether the interface takes from what the link's reservations leave."""
        return self.shares(rules) or self.borrows(rules)

    def to_json(self) -> dict[str, Any]:
        return {
            "granted": self.granted,
            "link": self.link,
            "rules": self.rules.to_json(),
            "deviceClass": self.device_class,
        }

    @classmethod
    def from_json(cls, data: Any) -> Terms | None:
        """Checkpointed terms; None for null or absent (a record from before them: its rate
        stays as prepared). ValueError naming the field for what is not terms."""
        if data is None:
            return None
        if not isinstance(data, Mapping):
            raise ValueError(f"bandwidth must be an object or null, got {data!r}")
        numbers = {}
        for name in ("granted", "link"):
            value = data.get(name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise ValueError(f"bandwidth.{name} must be bits per second or null, got {value!r}")
            numbers[name] = value
        try:
            rules = BandwidthRules.model_validate(data.get("rules") or {})
        except ValueError as exc:
            raise ValueError(f"bandwidth.rules: {exc}") from None
        device_class = data.get("deviceClass") or ""
        if not isinstance(device_class, str):
            raise ValueError(f"bandwidth.deviceClass must be a name, got {device_class!r}")
        return cls(numbers["granted"], numbers["link"], rules, device_class)
