"""From an allocated request to what the runtime executes: the one path a claim's configs take
to an Attachment, for prepare and `cnidra try` alike.

The verdict is `cnidra.api.verdict.check_request`, the function `cnidra validate --policy`
and the admission webhook call too: the request's named network put in place, its configs
checked against the class's CNIPolicy in the form the plugins read (`cnidra.api.tenant`),
merged and validated. What it approves is bound to the allocated link, named as cnidra owns
it, and given state directories under cnidra's root, each change written in the one spelling
the plugins read, so the bytes a plugin gets are the form that was judged."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cnidra.api.bandwidth import (
    BANDWIDTH_CAPACITY,
    DEFAULT_RULES,
    QuantityError,
    Terms,
    granted_bps,
)
from cnidra.api.constants import DRIVER_NAME
from cnidra.api.hostside import NodeFacts, judge_host_side
from cnidra.api.ipam import cnidra_ipam
from cnidra.api.issues import FieldPath, Issues
from cnidra.api.merge import ConfigEntry, Source, applicable
from cnidra.api.netconf import to_conflist
from cnidra.api.netpolicy_input import request_target
from cnidra.api.networks import NamedNetwork, NetworkCatalog
from cnidra.api.ownership import PrivateDirs, owned_network, owned_network_name
from cnidra.api.policy import PARENT_FIELDS, admin_paths, bind_to_device, governing_policy
from cnidra.api.refs import ObjectRef
from cnidra.api.tenant import written_by
from cnidra.api.verdict import ResolvedRequest, check_request
from cnidra.cni.attach import Attachment, changed
from cnidra.dra.verdicts import VerdictCache


def resolve_attachment(
    entries: Sequence[ConfigEntry],
    request: str,
    claim: ObjectRef,
    device: Device,
    dirs: PrivateDirs,
    issues: Issues,
    where: FieldPath,
    *,
    namespace_labels: Mapping[str, str] | None = None,
    catalog: NetworkCatalog | None = None,
    device_network: NamedNetwork | None = None,
    verdicts: VerdictCache | None = None,
    node: NodeFacts | None = None,
    granted: Mapping[str, str | int] | None = None,
    granted_where: FieldPath | None = None,
    device_class: str | None = None,
    class_known: bool = True,
    named_as: ObjectRef | None = None,
) -> Attachment | None:
    """The one path from a claim's configs to what the runtime executes: checked against the
    class's CNIPolicy, merged and validated as `cnidra validate` does, bound to the allocated
    link, named and given state directories as cnidra owns them. None (with the reasons in
    `issues`) when the request cannot be attached. `verdicts`: the same verdict, remembered
    for configs judged before (prepare's). `node`: the node's links as they are now; with it,
    the bound network's host-side effects are judged (`cnidra.api.hostside`: values that would
    change a shared host object pinned or refused). `granted`: the allocation result's
    `consumedCapacity` (at `granted_where`), whose `bandwidth`, with the class's CNIPolicy's
    `bandwidth`, is the rate limit the interface is held to (`Attachment.rate`).
    `device_class`: the DeviceClass the request asked for (the network a policy names as
    `deviceclass:<name>` when neither a reference nor the claim's config makes it).
    `class_known` False (`cnidra try` offline, the DeviceClass not given): the class's CNIPolicy
    is not judged (a warning in `issues` says so), everything else is. `named_as`: the claim
    the attachment is named and owned as when it is not `claim`, the one judged (`cnidra try`
    judges a claim in its own namespace and runs it as one of its own)."""
    before = len(issues.errors)
    judge = verdicts.check_request if verdicts is not None else check_request
    resolved = judge(
        entries,
        request,
        claim.namespace,
        namespace_labels,
        issues,
        where,
        class_known=class_known,
        catalog=catalog,
        device_network=device_network,
    )
    if resolved is None:
        if len(issues.errors) == before:
            issues.error(
                where,
                f"request {request!r} has no {DRIVER_NAME} config: add an opaque config "
                "with a CNIConfig (ifName and config) to the claim or its DeviceClass",
            )
        return None
    chosen = applicable(entries, request)
    class_entries = [e for e in chosen if e.source is Source.CLASS]
    verdict = governing_policy(class_entries, claim.namespace, namespace_labels, Issues())
    node_links = verdict.policy.node_links if verdict.policy else []
    rules = verdict.policy.claims if verdict.covered and verdict.policy else None
    try:
        terms = Terms(
            granted_bps(granted),
            link_speed_bps(node, device.link),
            (verdict.policy.bandwidth if verdict.policy else None) or DEFAULT_RULES,
            device_class or "",
        )
    except QuantityError as exc:
        at = (granted_where or where) / "consumedCapacity" / BANDWIDTH_CAPACITY
        issues.error(
            at, f"the bandwidth the allocation granted is no rate cnidra can enforce: {exc}"
        )
        return None
    network = resolved.network
    if device.link is not None and device_network is None and network and network.trusted:
        # the request got a link, and the claim names the admin's network to run on it
        unbound = _names_no_link(to_conflist(resolved.config.config or {}), device.link)
        if unbound is not None:
            issues.error(
                where,
                f"{network.reference} is the admin's and runs where its config binds it; "
                f"{unbound}, so a claim cannot aim it at link {device.link!r}: request the "
                "network's own device (its DeviceClass selects "
                f'device.attributes["{DRIVER_NAME}"].network)',
            )
            return None
    attachment = attachment_from(resolved, named_as or claim, device, dirs, issues, where)
    if attachment is None:
        return None
    ranges = rules.ip_ranges if rules is not None else None
    tenant = tenant_writer(resolved, class_entries)
    static = tenant_static_ipam(attachment.network, tenant)
    network_as_pinned = attachment.network
    if node is not None and attachment.parent:
        before = len(issues.errors)
        anchor = next(
            (e.path / "config" for e in reversed(resolved.entries) if "config" in e.parameters),
            where,
        )
        network_as_pinned = judge_host_side(
            attachment.network, attachment.parent, node, tenant, issues, anchor
        )
        if len(issues.errors) > before:
            return None
    return changed(  # one copy made with every change (the network with its host side pinned)
        attachment,
        network=network_as_pinned,
        node_link_allowed=attachment.parent in node_links,
        tenant_pool=tenant_chose_pool(resolved, class_entries),
        pool_ranges=tuple(ranges) if ranges is not None else None,
        tenant_static=bool(static),
        rate=terms.decide(),  # a Leftover share is decided by the node (cnidra.nri.bandwidth)
        bandwidth=terms,
        policy_network=policy_network(resolved, claim, attachment.network_label, device_class),
    )


def policy_network(
    resolved: ResolvedRequest, claim: ObjectRef, config_name: str, device_class: str | None
) -> str:
    """The network of the interface as a policy's `policy-for` names it
    (docs/network-policy.md; the one rule, cnidra.api.netpolicy_input.request_target, which
    `cnidra validate` uses too)."""
    return request_target(resolved, claim.namespace, config_name, device_class).key


def link_speed_bps(node: NodeFacts | None, link: str | None) -> int | None:
    """The allocated link's speed in bits per second, as the inventory read it (the
    `bandwidth` capacity its device publishes); None: not known."""
    if node is None or not link:
        return None
    facts = node.links.get(link)
    if facts is None or not facts.speed_mbps:
        return None
    return facts.speed_mbps * 10**6


def tenant_static_ipam(
    network: Mapping[str, object], tenant: Callable[[tuple[object, ...]], bool]
) -> list[int]:
    """Indexes of the plugins whose `static` IPAM a tenant wrote (its type or its
    addresses): prepare leases those addresses through the cluster IPAM (docs/ipam.md)."""
    plugins = network.get("plugins")
    out = []
    for i, plugin in enumerate(plugins if isinstance(plugins, list) else []):
        ipam = plugin.get("ipam") if isinstance(plugin, Mapping) else None
        if not isinstance(ipam, Mapping) or ipam.get("type") != "static":
            continue
        if tenant(("plugins", i, "ipam", "type")) or tenant(("plugins", i, "ipam", "addresses")):
            out.append(i)
    return out


def tenant_writer(
    resolved: ResolvedRequest, class_entries: Sequence[ConfigEntry]
) -> Callable[[tuple[object, ...]], bool]:
    """Whether a tenant wrote the value at a path of the network's conflist form
    (`("plugins", 0, "mtu")`): a tenant's NetworkAttachmentDefinition, or the claim's own
    config where the class's did not write. The admin's named networks and class configs
    are the admin's."""
    if resolved.network is not None:
        trusted = resolved.network.trusted
        return lambda path: not trusted
    if not any(e.source is Source.CLAIM and "config" in e.parameters for e in resolved.entries):
        return lambda path: False
    config = resolved.config.config
    single = config is not None and "plugins" not in config
    admin = admin_paths(class_entries)

    def tenant(path: tuple[object, ...]) -> bool:
        raw: tuple[object, ...] = path
        if single and path[:2] == ("plugins", 0):
            raw = path[2:]
        return not written_by(tuple(raw), admin)  # type: ignore[arg-type]

    return tenant


def tenant_chose_pool(resolved: ResolvedRequest, class_entries: Sequence[ConfigEntry]) -> bool:
    """Whether the network's cnidra-IPAM pool is a tenant's choice: a NetworkAttachmentDefinition
    (its namespace's) names it, or the claim's own config does where the class's did not."""
    if resolved.network is not None:
        return not resolved.network.trusted
    if not any(e.source is Source.CLAIM and "config" in e.parameters for e in resolved.entries):
        return False
    config = resolved.config.config
    assert config is not None
    admin = admin_paths(class_entries)
    for index, _ in cnidra_ipam(to_conflist(config)):
        paths = (("plugins", index, "ipam", "pool"), ("ipam", "pool"))
        if not any(written_by(path, admin) for path in paths):
            return True
    return False


def _names_no_link(conflist: Mapping[str, object], link: str) -> str | None:
    """Why an admin's network is not bound to `link` by its own config (None: it is, every
    plugin that takes a parent names `link`, or none takes one)."""
    plugins = conflist.get("plugins")
    for plugin in plugins if isinstance(plugins, list) else []:
        if not isinstance(plugin, Mapping):
            continue
        field = PARENT_FIELDS.get(str(plugin.get("type")))
        if field is None:
            continue
        named = next((v for k, v in plugin.items() if k.lower() == field.lower()), None)
        if named in (None, ""):
            return f"its {plugin.get('type')} plugin names no {field}"
        if named != link:
            return f"its {plugin.get('type')} plugin's {field} is {named!r}"
    return None


@dataclass(frozen=True)
class Device:
    """Where the scheduler put a request: the allocated device, and the host link it is
    (None: no link to bind to, as in `cnidra try`)."""

    pool: str
    name: str
    share_id: str | None = None
    link: str | None = None


def attachment_from(
    resolved: ResolvedRequest,
    claim: ObjectRef,
    device: Device,
    dirs: PrivateDirs,
    issues: Issues | None = None,
    where: FieldPath | None = None,
) -> Attachment | None:
    """None only when binding to the allocated link fails (the reasons in `issues`)."""
    config = resolved.config
    assert config.config is not None  # complete when resolved
    conflist = to_conflist(config.config)
    if device.link is not None:
        issues = issues if issues is not None else Issues()
        before = len(issues.errors)
        anchor = next(
            (e.path / "config" for e in reversed(resolved.entries) if "config" in e.parameters),
            where or FieldPath(),
        )
        conflist = bind_to_device(conflist, device.link, anchor, issues)
        if len(issues.errors) > before:
            return None
    label = str(conflist["name"])
    # a network the claim defines or changes is its namespace's; one wholly from the class is
    # the admin's, shared by every namespace using the class (docs/state.md)
    tenant = any(e.source is Source.CLAIM and "config" in e.parameters for e in resolved.entries)
    owner = resolved.network.owner_namespace if resolved.network else None
    name = owned_network_name(label, owner or (claim.namespace if tenant else None))
    return Attachment(
        claim=claim,
        request=resolved.request,
        if_name=config.if_name or "",
        network=owned_network(conflist, name, dirs),
        pool=device.pool,
        device=device.name,
        capability_args=config.capabilities.runtime_values() if config.capabilities else {},
        cni_args=tuple(sorted((config.args or {}).items())),
        share_id=device.share_id,
        network_label=label,
        parent=device.link or "",
        on_demand=config.attach == "OnDemand",
        explicit_name=config.if_name is not None,
        if_name_prefix=config.if_name_prefix,
        status_name=resolved.network.status_name if resolved.network else "",
        ipam_claim=config.ipam_claim_reference,
    )
