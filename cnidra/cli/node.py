"""`cnidra node`: a pod's secondary networks as this node knows them, through the node API
(no apiserver): `pods`, `describe POD`, `events [--follow]`."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml

from cnidra.agent.settings import DEFAULTS
from cnidra.cli.output import LazyConsole, escape, output_option
from cnidra.state.layout import StateLayout

if TYPE_CHECKING:  # gRPC loads only when a node command runs: `cnidra validate` stays quick
    from google.protobuf.message import Message

    from cnidra._proto.node.v1alpha1 import api_pb2 as api
    from cnidra.nodeapi.client import NodeAPIError, NodeClient

HOW = (
    "Runs on the node, as root (the node API's socket is root's): inside the driver's pod, "
    "`kubectl -n cnidra-system exec <driver pod on that node> -- cnidra node pods`, or from "
    "your machine `kubectl cnidra node pods -n NAMESPACE` (the kubectl plugin finds the nodes "
    "that run the namespace's pods and the driver pod on each for you; `kubectl cnidra node "
    "describe POD -n NAMESPACE` that pod's node)."
)
app = typer.Typer(
    no_args_is_help=True,
    help="Pod networks on this node, from the driver's node API (no apiserver needed). " + HOW,
)
out = LazyConsole(soft_wrap=True, highlight=False, markup=False)  # pod names are not markup
err = LazyConsole(stderr=True, soft_wrap=True, highlight=False)
CALL_TIMEOUT = 5.0


Socket = Annotated[
    Path,
    typer.Option("--socket", envvar="CNIDRA_NODE_SOCKET", help="the driver's node API socket"),
]
Namespace = Annotated[str, typer.Option("--namespace", "-n", help="only this namespace")]
DEFAULT_SOCKET = StateLayout(DEFAULTS.state_dir).node_socket


def stub(socket: Path) -> NodeClient:
    from cnidra.nodeapi.client import NodeClient

    return NodeClient(socket)


def fail(exc: NodeAPIError, socket: Path) -> typer.Exit:
    from cnidra.util.rpc import Status

    if exc.code is Status.UNAVAILABLE:
        why = (
            "permission denied: the node API is root's"
            if "ermission" in exc.details
            else ("is the driver running on this node?")
        )
        err.print(f"[red]error:[/] {escape(f'no cnidra driver answers on {socket} ({why})')}")
        err.print(escape(HOW), markup=False)
    else:
        err.print(f"[red]error:[/] {escape(exc.details)}")
    return typer.Exit(1)


def as_data(message: Message) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(message, preserving_proto_field_name=True)


def emit(data: Any, output: str) -> None:
    if output == "json":
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        typer.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


def interfaces(pod: api.PodNetwork) -> str:
    return ", ".join(
        f"{a.if_name} {' '.join(a.ips) or '-'}" if a.state == "attached" else a.if_name
        for a in pod.attachments
    )


@app.command()
def pods(
    namespace: Namespace = "",
    output: str = output_option("table", "table", "wide", "json", "yaml"),
    socket: Socket = DEFAULT_SOCKET,
) -> None:
    """Every pod on this node with cnidra claims or interfaces."""
    from cnidra._proto.node.v1alpha1 import api_pb2 as api
    from cnidra.nodeapi.client import NodeAPIError

    try:
        reply = stub(socket).call(
            "ListPodNetworks",
            api.ListPodNetworksRequest(namespace=namespace),
            api.ListPodNetworksResponse,
            CALL_TIMEOUT,
        )
    except NodeAPIError as exc:
        raise fail(exc, socket) from None
    if output in ("json", "yaml"):
        emit([as_data(p) for p in reply.pods], output)
        return
    from rich.table import Table

    wide = output == "wide"
    table = Table(box=None, pad_edge=False)
    columns = ["NAMESPACE", "POD", "STATE", "INTERFACES", "PROBLEM"]
    if wide:
        columns[4:4] = ["NETWORKS", "CLAIMS", "SANDBOX"]
    for column in columns:
        table.add_column(column, overflow="fold")
    for pod in reply.pods:
        row = [pod.pod.namespace or "?", pod.pod.name or pod.pod.uid, pod.state, interfaces(pod)]
        if wide:
            row += [
                ", ".join(f"{a.if_name} {a.network}" for a in pod.attachments),
                ", ".join(c.name for c in pod.claims),
                pod.sandbox_id[:12] or "-",
            ]
        table.add_row(*row, pod.problem)
    out.print(table)


@app.command()
def describe(
    pod: Annotated[str, typer.Argument(help="the pod's name (or its UID with --uid)")],
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    uid: Annotated[bool, typer.Option("--uid", help="POD is the pod's UID")] = False,
    output: str = output_option("table", "table", "wide", "json", "yaml"),
    socket: Socket = DEFAULT_SOCKET,
) -> None:
    """One pod's networks: every attachment, its result and state, and why one is missing."""
    from cnidra._proto.node.v1alpha1 import api_pb2 as api
    from cnidra.nodeapi.client import NodeAPIError

    request = (
        api.QueryPodNetworkRequest(uid=pod)
        if uid
        else api.QueryPodNetworkRequest(namespace=namespace, name=pod)
    )
    try:
        view = stub(socket).call("QueryPodNetwork", request, api.PodNetwork, CALL_TIMEOUT)
    except NodeAPIError as exc:
        raise fail(exc, socket) from None
    if output in ("json", "yaml"):
        emit(as_data(view), output)
        return
    p = view.pod
    out.print(f"Pod:        {p.namespace}/{p.name} ({p.uid})")
    out.print(f"State:      {view.state}")
    out.print(f"Sandbox:    {view.sandbox_id or '-'}")
    out.print(f"Netns:      {view.netns or '-'}")
    out.print("Claims:     " + (", ".join(f"{c.name} ({c.uid})" for c in view.claims) or "-"))
    if view.problem:
        out.print(f"Problem:    {view.problem}", style="yellow")
    out.print("Interfaces:")
    for a in view.attachments:
        out.print(f"  {a.if_name}  [{a.state}]")
        out.print(f"    claim {a.claim.namespace}/{a.claim.name}, request {a.request}")
        chain = " -> ".join(a.plugins)
        out.print(f"    network {a.network} (runs as {a.cni_network}), plugins {chain}")
        out.print(f"    device {a.pool}/{a.device} on link {a.parent or '-'}")
        if a.ips or a.mac:
            out.print(f"    addresses {' '.join(a.ips) or '-'}, mac {a.mac or '-'}")
        for text in bandwidth_lines(a):
            out.print(f"    {text}")
        for text in policy_lines(a, view.policy_undoable_by):
            out.print(f"    {text}")
        if output == "wide" and a.cni_result_json:
            out.print(f"    CNI result {a.cni_result_json}")
    if view.policy_undoable_by:
        out.print(
            "Policy:     containers "
            + ", ".join(view.policy_undoable_by)
            + " are privileged or have CAP_NET_ADMIN: they can delete the policy tables",
            style="yellow",
        )
    out.print("Events:")
    for e in view.events:
        out.print(f"  {line(e)}")
    if not view.events:
        out.print("  none recorded")


def bandwidth_lines(a: api.Attachment) -> list[str]:
    """The rate limit an interface reserved, and what it holds now in each direction with
    what the limit dropped: nothing when it reserved none."""
    if not a.HasField("reserved"):
        return []
    held = {
        "leftover": f"bandwidth reserved none; held to {_rate(a.reserved)} each way, its share "
        "of what the link's reservations leave",
        "class": f"bandwidth reserved none; held to {_rate(a.reserved)} each way, as its class "
        "says of a claim that reserved nothing",
    }
    lines = [held.get(a.held_as, f"bandwidth reserved {_rate(a.reserved)} each way")]
    if not a.HasField("enforced"):
        return lines
    for name in ("egress", "ingress"):
        if a.enforced.HasField(name):
            d = getattr(a.enforced, name)
            lines.append(
                f"  {name:<8}enforced {_rate(d.limit)}: {d.sent_packets} packets sent, "
                f"{d.drops} dropped, {d.overlimits} overlimits"
            )
        else:
            lines.append(f"  {name:<8}not enforced")
    if a.enforced.error:
        lines.append(f"  problem: {a.enforced.error}")
    return lines


def policy_lines(a: api.Attachment, undoable_by: Sequence[str] = ()) -> list[str]:
    """The network policy of an interface: its network as policies name it, the policies that
    select the pod there, each counted rule with its packets; nothing when none is known.
    `undoable_by`: the pod's containers that could delete the table in its namespace."""
    if not a.HasField("policy"):
        return []
    p = a.policy
    lines = [f"policy network {p.network}: " + (", ".join(p.policies) or "no policy selects it")]
    if p.not_enforced:
        lines.append(f"  NOT ENFORCED: {p.not_enforced}")
    elif p.host_interface:
        lines.append(
            f"  enforced on the host's end of the pod's veth ({p.host_interface}), where the "
            "pod cannot undo it"
        )
    elif undoable_by:
        lines.append(
            f"  UNDOABLE: enforced in the pod's network namespace, where containers "
            f"{', '.join(undoable_by)} (privileged or CAP_NET_ADMIN) can delete it"
        )
    for rule in p.rules:
        lines.append(
            f"  {rule.verdict:<7}{rule.packets:>10} packets {rule.bytes:>12} bytes  {rule.comment}"
        )
    if p.error:
        lines.append(f"  problem: {p.error}")
    return lines


def _rate(limit: api.RateLimit) -> str:
    from cnidra.api.bandwidth import format_rate

    shown = f"{format_rate(limit.rate_bps)}bit/s"
    if limit.ceil_bps > limit.rate_bps:
        shown += f" (bursts to {format_rate(limit.ceil_bps)}bit/s)"
    return shown


def line(e: api.Event, wide: bool = False) -> str:
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(e.time))
    took = f" ({e.duration_ms:.1f} ms)" if e.duration_ms else ""
    sandbox = f" sandbox {e.sandbox_id[:12]}" if wide and e.sandbox_id else ""
    return f"{when} {e.kind:<13} {e.pod.namespace}/{e.pod.name} {e.message}{took}{sandbox}"


@app.command()
def events(
    pod: Annotated[str, typer.Argument(help="only this pod (by name)")] = "",
    namespace: Namespace = "",
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep printing new events")
    ] = False,
    output: str = output_option("table", "table", "wide", "json", "yaml"),
    socket: Socket = DEFAULT_SOCKET,
) -> None:
    """The node's journal of attaches and detaches; with --follow, as they happen."""
    from cnidra._proto.node.v1alpha1 import api_pb2 as api
    from cnidra.nodeapi.client import NodeAPIError

    def show(event: api.Event) -> None:
        if output == "json":  # one object a line, as they come (JSON Lines)
            typer.echo(json.dumps(as_data(event), sort_keys=True))
        elif output == "yaml":  # one document each
            typer.echo("---\n" + yaml.safe_dump(as_data(event), sort_keys=True).rstrip())
        else:
            out.print(line(event, wide=output == "wide"))

    request = api.WatchEventsRequest(namespace=namespace, name=pod, follow=follow)
    try:
        stub(socket).stream(
            "WatchEvents", request, api.Event, None if follow else CALL_TIMEOUT, show
        )
    except NodeAPIError as exc:
        raise fail(exc, socket) from None
    except KeyboardInterrupt:
        pass


Claim = Annotated[str, typer.Option("--claim", help="the claim's name, or the pod's name for it")]
Request = Annotated[str, typer.Option("--request", help="the claim's request")]


def hotplug(attach: bool, pod: str, namespace: str, claim: str, request: str, socket: Path) -> None:
    from cnidra._proto.node.v1alpha1 import api_pb2 as api
    from cnidra.nodeapi.client import NodeAPIError

    fields = {"namespace": namespace, "name": pod, "claim": claim, "request": request}
    call: Any = (
        ("AttachNetwork", api.AttachNetworkRequest(**fields))
        if attach
        else ("DetachNetwork", api.DetachNetworkRequest(**fields))
    )
    try:
        view = stub(socket).call(call[0], call[1], api.PodNetwork, 30)
    except NodeAPIError as exc:
        raise fail(exc, socket) from None
    out.print(f"{namespace}/{pod}: {interfaces(view) or 'no cnidra interfaces'}")


@app.command()
def attach(
    pod: Annotated[str, typer.Argument(help="the pod's name")],
    claim: Claim,
    request: Request,
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    socket: Socket = DEFAULT_SOCKET,
) -> None:
    """Plug an on-demand network (a CNIConfig with attach: OnDemand) into the running pod."""
    hotplug(True, pod, namespace, claim, request, socket)


@app.command()
def detach(
    pod: Annotated[str, typer.Argument(help="the pod's name")],
    claim: Claim,
    request: Request,
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    socket: Socket = DEFAULT_SOCKET,
) -> None:
    """Unplug an on-demand network from the running pod; its other interfaces stay."""
    hotplug(False, pod, namespace, claim, request, socket)
