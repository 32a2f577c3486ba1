"""The `cnidra` command."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from cnidra.agent.settings import (  # light: no driver imports
    DEFAULTS,
    DriverSettings,
    LogSettings,
    check,
    env_of,
    flag_of,
)
from cnidra.api.convert import ConvertError, OutputKind, render_yaml
from cnidra.api.issues import ROOT
from cnidra.api.loading import LoadError, load_json, load_yaml
from cnidra.api.validate import (
    CLAIM_CONFIG_LABEL,
    CLASSES_ANNOTATION,
    Admission,
    DocumentReport,
    validate_documents,
)
from cnidra.cli.node import app as node_app
from cnidra.cli.output import (
    FileReport,
    LazyConsole,
    as_json,
    escape,
    output_option,
    print_text,
)


def _plain_help_types() -> None:
    """typer shows each parameter's Python type in --help (`<str>`, `<bool>`, `<list[Path]>`);
    show what kubectl and click users know instead: nothing for flags and arguments (their
    names say it), the value's kind (TEXT, PATH, a choice) for options."""
    from typer.core import TyperArgument, TyperOption

    kinds = {"str": "TEXT", "Path": "PATH", "int": "INTEGER", "float": "FLOAT"}

    def option_type(self: TyperOption, ctx: Any) -> str | None:
        if self.is_flag or self.count:
            return None
        if self.metavar is not None:
            return str(self.metavar)
        label = str(self.display_type(ctx)).strip("<>").removeprefix("list[").removesuffix("]")
        return kinds.get(label, f"[{label}]" if "|" in label else label.upper())

    def argument_type(self: TyperArgument, ctx: Any) -> str | None:
        return None

    TyperOption.display_type_rich = option_type  # type: ignore[method-assign]
    TyperArgument.display_type_rich = argument_type  # type: ignore[method-assign,assignment]


_plain_help_types()


def setup_logs(logs: LogSettings) -> None:
    from cnidra.observe.logs import configure

    try:
        configure(logs.log_level, logs.log_format, logs.log_level_file or None)
    except ValueError as exc:
        raise usage_error(str(exc)) from None


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"cnidra {version('cnidra')}")
        except PackageNotFoundError:
            typer.echo("cnidra (not installed as a package)")
        raise typer.Exit()


app = typer.Typer(
    no_args_is_help=True,
    help="cnidra: secondary pod interfaces from CNI plugins, through DRA. Exit codes: 0 done, "
    "1 the input is invalid (or the operation failed), 2 usage: a missing file, a bad flag.",
)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """cnidra: secondary pod interfaces from CNI plugins, through DRA."""


err = LazyConsole(stderr=True, soft_wrap=True)

EXIT_INVALID = 1
EXIT_USAGE = 2


def usage_error(message: str) -> typer.Exit:
    err.print(f"[red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(EXIT_USAGE)


def read_input(path: Path) -> bytes:
    try:
        return sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        raise usage_error(f"cannot read {path}: {exc.strerror}") from None


JSON_SUFFIXES = (".conf", ".conflist", ".json")


def load_documents(path: Path) -> list[Any] | LoadError:
    """The file's documents, or why it cannot be read (a verdict, not a crash): YAML, or strict
    JSON (as libcni reads it) for a .conf, .conflist or .json file and for JSON text."""
    data = read_input(path)
    try:
        if path.suffix in JSON_SUFFIXES or data.lstrip()[:1] in (b"{", b"["):
            return _json_documents(data, str(path), path.suffix in JSON_SUFFIXES)
        return load_yaml(data, str(path))
    except LoadError as exc:
        return exc


def _json_documents(data: bytes, name: str, named_json: bool) -> list[Any]:
    """A JSON file's one document (a JSON list stands for its items, as a kind: List does).
    Text that only looks like JSON (a YAML flow mapping, `{kind: ...}`) is read as YAML,
    unless the file is named as JSON or is a CNI config, which libcni reads as JSON."""
    try:
        value = load_json(data, name)
    except LoadError as strict:
        if re.search(rb",\s*[]}]", data):
            strict = LoadError(f"{strict} (a trailing comma? JSON allows none)")
        if named_json:
            raise strict from None
        docs = load_yaml(data, name)
        if any(isinstance(d, dict) and "kind" not in d for d in docs):
            raise LoadError(f"{strict} (libcni reads a CNI config as strict JSON)") from None
        return docs
    if isinstance(value, list):
        return value
    return [value] if value is not None else []


def expand_paths(paths: list[Path]) -> list[Path]:
    """Files as given; a directory stands for its .yaml, .yml and .json files (as
    `kubectl apply -f DIR` reads it, not recursively), sorted."""
    out: list[Path] = []
    for path in paths:
        if str(path) != "-" and path.is_dir():
            found = sorted(
                p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file()
            )
            out += found or [path]  # an empty one is told as a usage error
        else:
            out.append(path)
    return out


# a label's key (an optional DNS-subdomain prefix and a name) and value, as the apiserver allows
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def parse_annotations(pairs: list[str], flag: str = "--namespace-annotation") -> dict[str, str]:
    """KEY=VALUE each (the value may hold commas and '='); a usage error naming the flag."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not _is_key(key):
            raise usage_error(
                f"{flag} {pair!r}: must be KEY=VALUE with KEY an annotation key (an optional DNS "
                "subdomain and '/', then a name), e.g. "
                f"{CLASSES_ANNOTATION}=storage.cni.networking.x-k8s.io"
            )
        out[key] = value
    return out


def _is_key(key: str) -> bool:
    """A Kubernetes label or annotation key: an optional DNS subdomain and '/', then a name."""
    prefix, slash, name = key.rpartition("/")
    return (
        len(name) <= 63
        and bool(_LABEL_NAME.match(name))
        and (not slash or (len(prefix) <= 253 and bool(_LABEL_PREFIX.match(prefix))))
    )


def parse_labels(text: str, flag: str = "--namespace-labels") -> dict[str, str]:
    """`k=v,k2=v2` as a label map; a usage error naming the flag for anything else."""
    form = (
        f"{flag} takes KEY=VALUE pairs separated by commas, each a Kubernetes label, e.g. "
        f"{CLAIM_CONFIG_LABEL}=true,team=a (an empty value is KEY=)"
    )
    labels: dict[str, str] = {}
    if not text.strip():
        return labels
    for pair in text.split(","):
        key, eq, value = pair.strip().partition("=")
        if not eq:
            raise usage_error(f"{flag} {pair!r}: not KEY=VALUE; {form}")
        if not _is_key(key):
            raise usage_error(
                f"{flag} {pair!r}: {key!r} is not a label key (an optional DNS subdomain and "
                "'/', then at most 63 letters, digits, '-', '_' or '.', starting and ending "
                f"with a letter or digit); {form}"
            )
        if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
            raise usage_error(
                f"{flag} {pair!r}: {value!r} is not a label value (empty, or at most 63 letters, "
                f"digits, '-', '_' or '.', starting and ending with a letter or digit); {form}"
            )
        if key in labels:
            raise usage_error(f"{flag}: label {key!r} is given twice; {form}")
        labels[key] = value
    return labels


def load_yaml_documents(path: Path) -> list[Any]:
    """For commands that need documents to go on (`try`, `--policy`): unreadable is final."""
    docs = load_documents(path)
    if isinstance(docs, LoadError):
        err.print(f"[red]invalid:[/] {escape(str(docs))}", highlight=False)
        raise typer.Exit(EXIT_INVALID)
    return docs


def unreadable(error: LoadError | list[Any] | None) -> list[DocumentReport]:
    report = DocumentReport(0, "?", None)
    message = str(error) if isinstance(error, LoadError) else "is empty: there is no document in it"
    report.issues.error(ROOT, message)
    return [report]


@app.command()
def validate(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="YAML files (multi-document), .conf/.conflist JSON, directories (their .yaml, "
            ".yml and .json files); - for stdin"
        ),
    ],
    output: str = output_option("table", "table", "wide", "json", "yaml"),
    policy: Annotated[
        list[Path] | None,
        typer.Option(
            "--policy",
            help="DeviceClasses (with their CNIPolicy) the claims are checked against, as "
            "prepare and the webhook check them; DeviceClasses in FILES count too",
        ),
    ] = None,
    namespace_labels: Annotated[
        str | None,
        typer.Option(
            "--namespace-labels",
            help="KEY=VALUE,...: the claims' namespace's labels, as the shipped admission "
            f"({CLAIM_CONFIG_LABEL}=true) and a CNIPolicy namespaceSelector see them; without "
            "it, the admission's label is a warning",
        ),
    ] = None,
    namespace_annotations: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace-annotation",
            help="KEY=VALUE (repeatable): an annotation of the claims' namespace, as the "
            f"shipped admission reads {CLASSES_ANNOTATION} (the admin classes it may use, "
            "comma-separated); without it, that rule is a warning",
        ),
    ] = None,
) -> None:
    """Check ResourceClaims, ResourceClaimTemplates, DeviceClasses, CNIConfigs, CNI config
    files, and the claims of Pods and workloads, as the apiserver, the shipped admission, the
    webhook and prepare judge them."""
    labels = parse_labels(namespace_labels) if namespace_labels is not None else None
    annotations = (
        parse_annotations(namespace_annotations) if namespace_annotations is not None else None
    )
    files = expand_paths(files)
    missing = [
        f for f in [*files, *(policy or [])] if str(f) != "-" and (not f.exists() or f.is_dir())
    ]
    loaded = {f: load_documents(f) for f in files if f not in missing}
    admin = [d for p in policy or [] if p not in missing for d in load_yaml_documents(p)]
    # every file's documents judged together, as the cluster sees them: a Pod in one file and
    # its claim templates in another keep the cross-claim interface-name check
    every: list[Any] = []
    spans: dict[Path, tuple[int, int]] = {}
    for f, docs in loaded.items():
        if isinstance(docs, list) and docs:
            expanded = list_items(docs)
            spans[f] = (len(every), len(expanded))
            every += expanded
    judged = validate_documents(every, admin, labels, admission=Admission(labels, annotations))
    reports = []
    for f in [*files, *[p for p in policy or [] if p in missing]]:
        if f in missing:
            why = (
                "is a directory with no .yaml, .yml or .json file"
                if f.is_dir()
                else "does not exist"
            )
            report = DocumentReport(0, "?", None)
            report.issues.error(ROOT, f"{f} {why}; give YAML files or directories (or - for stdin)")
            reports.append(FileReport(str(f), [report]))
            continue
        if f not in spans:
            docs = loaded[f]
            reports.append(
                FileReport(str(f), unreadable(docs if isinstance(docs, LoadError) else None))
            )
            continue
        start, count = spans[f]
        mine = judged[start : start + count]
        for report in mine:
            report.index -= start
        reports.append(FileReport(str(f), mine))
    result = as_json(reports)
    if output == "json":
        typer.echo(json.dumps(result, indent=2))
    elif output == "yaml":
        typer.echo(yaml.safe_dump(result, sort_keys=False), nl=False)
    else:
        from rich.console import Console

        print_text(reports, Console(soft_wrap=True, emoji=False), wide=output == "wide")
    if missing:
        raise typer.Exit(EXIT_USAGE)
    raise typer.Exit(0 if result["valid"] else EXIT_INVALID)


def list_items(docs: list[Any]) -> list[Any]:
    """A `kind: List` (what `kubectl get -o yaml` prints) stands for its items."""
    out: list[Any] = []
    for doc in docs:
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "List"
            and isinstance(doc.get("items"), list)
        ):
            out += doc["items"]
        else:
            out.append(doc)
    return out


@app.command(short_help="Turn Multus NADs, CNI conf files and annotated workloads into claims.")
def convert(
    file: Annotated[
        Path,
        typer.Argument(
            help=".conf/.conflist JSON, NetworkAttachmentDefinitions, or workloads with Multus' "
            "networks annotation (YAML, several documents or a kind: List; - for stdin)"
        ),
    ],
    kind: Annotated[
        OutputKind, typer.Option("--kind", help="what to make of NADs and CNI files")
    ] = OutputKind.TEMPLATE,
    name: Annotated[
        str | None, typer.Option("--name", help="object name (default: network name)")
    ] = None,
    if_name: Annotated[
        str | None,
        typer.Option("--if-name", help="interface name in the pod (default: net1, net2, ...)"),
    ] = None,
    reference: Annotated[
        bool,
        typer.Option(
            "--reference",
            help="claims that reference each NetworkAttachmentDefinition instead of copying it",
        ),
    ] = False,
    policy: Annotated[
        list[Path] | None,
        typer.Option(
            "--policy",
            help="DeviceClasses (with their CNIPolicy) the output must pass, as `validate "
            "--policy` checks it (default: the shipped class cni.networking.x-k8s.io)",
        ),
    ] = None,
    output: str = output_option("yaml", "json", "yaml"),
) -> None:
    """Print what a Multus user has as objects for kubectl apply: a .conf/.conflist, every
    NetworkAttachmentDefinition of a manifest, or the Pods, Deployments, StatefulSets,
    DaemonSets, Jobs and CronJobs that carry the k8s.v1.cni.cncf.io/networks annotation (a claim
    template each, the workload rewritten to use it; the NADs they use must be given beside
    them, and are copied in, adapted; whereabouts' IPPools and OverlappingRangeIPReservations
    given too are excluded from the pools). MultiNetworkPolicies given are carried over (cnidra
    reads them as Multus does; a NAD whose config the claims copy gets the claims' network added
    to policy-for). Everything printed passes the shipped class's policy (or --policy's).
    Notes on stderr say what changed and what could not be carried; exit 1 when something
    could not be converted, 2 for unusable input."""
    from cnidra.api.convert import convert as convert_all
    from cnidra.api.convert import read_all

    for path in policy or []:
        if str(path) != "-" and (not path.exists() or path.is_dir()):
            raise usage_error(f"--policy {path}: no such file; give a YAML file of DeviceClasses")
    classes = [
        d
        for path in policy or []
        for d in list_items(load_yaml_documents(path))
        if isinstance(d, dict) and d.get("kind") == "DeviceClass"
    ]
    if policy and not classes:
        raise usage_error(f"--policy {', '.join(map(str, policy))}: has no DeviceClass")
    try:
        found = read_all(read_input(file), str(file))
    except ConvertError as exc:
        message = str(exc)
        raise usage_error(
            message if message.startswith(f"{file}:") else f"{file}: {message}"
        ) from None
    sources, workloads = found.sources, found.workloads
    if name and workloads:
        raise usage_error(
            "--name names the object made of a NAD or CNI file; a workload's claim template is "
            "named after the workload (NAME-networks)"
        )
    if workloads and (reference or kind is not OutputKind.TEMPLATE):
        raise usage_error(
            "--reference and --kind apply to NADs and CNI files; a workload becomes a claim "
            "template with its NADs' configs copied in (give the NADs beside it)"
        )
    if name and len(sources) > 1 and not workloads:
        raise usage_error(f"--name names one object; {file} has {len(sources)} NADs")
    try:
        result = convert_all(
            sources,
            workloads,
            kind,
            name,
            if_name,
            reference,
            found.held,
            classes or None,
            found.policies,
        )
    except ConvertError as exc:
        raise usage_error(f"{file}: {exc}") from None
    if output == "json":  # one document: a List, as kubectl prints several
        typer.echo(json.dumps({"apiVersion": "v1", "kind": "List", "items": result.docs}, indent=2))
    else:
        typer.echo("---\n".join(render_yaml(doc) for doc in result.docs), nl=False)
    for note in [*found.notes, *result.notes]:
        err.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    for refusal in result.refused:
        err.print(f"[red]not converted:[/] {escape(refusal)}", highlight=False)
    if result.refused:
        raise typer.Exit(EXIT_INVALID)


DEFAULT_CNI_PATH = "/opt/cni/bin:/usr/lib/cni"


@app.command("try", short_help="Run a claim's plugins in throwaway namespaces, then clean up.")
def try_(
    file: Annotated[
        Path, typer.Argument(help="ResourceClaim, ResourceClaimTemplate or CNIConfig YAML")
    ],
    keep: Annotated[
        bool, typer.Option("--keep", help="leave the interfaces and namespaces")
    ] = False,
    netns_path: Annotated[
        str | None, typer.Option("--netns", help="pod namespace to use instead of a new one")
    ] = None,
    host: Annotated[
        bool, typer.Option("--host", help="run against the real host, not a throwaway node")
    ] = False,
    output: str = output_option("yaml", "json", "yaml"),
    cni_path: Annotated[
        str, typer.Option("--cni-path", envvar="CNIDRA_CNI_PATH", help="plugin directories")
    ] = DEFAULT_CNI_PATH,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            envvar="CNIDRA_TRY_STATE_DIR",
            help="with --host: where the CNI cache and IPAM pools go (default /var/lib/cnidra/try)",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per plugin call")] = 30.0,
    policy: Annotated[
        list[Path] | None,
        typer.Option(
            "--policy",
            help="DeviceClasses (with their CNIPolicy): each request is judged as prepare "
            "judges it, and what prepare refuses is not run; DeviceClasses in FILE count too",
        ),
    ] = None,
    namespace_labels: Annotated[
        str | None,
        typer.Option(
            "--namespace-labels",
            help="KEY=VALUE,...: the claim's namespace's labels, as a CNIPolicy "
            "namespaceSelector sees them",
        ),
    ] = None,
) -> None:
    """ADD a claim's attachments into a namespace, print the status the driver would write,
    then DEL everything (unless --keep). What cnidra validate refuses is not run; with
    --policy, neither is what prepare refuses."""
    from cnidra.cli.try_ import (
        NoParent,
        Refused,
        TryPlan,
        default_pool,
        execute,
        plan_attachments,
    )

    labels = parse_labels(namespace_labels) if namespace_labels is not None else None
    if netns_path and not Path(netns_path).exists():
        raise usage_error(f"--netns {netns_path}: no such namespace")
    for path in [file, *(policy or [])]:
        if str(path) != "-" and (not path.exists() or path.is_dir()):
            why = "is a directory" if path.is_dir() else "does not exist"
            raise usage_error(f"{path} {why}; give a YAML file (or - for stdin)")
    admin = [d for p in policy or [] for d in load_yaml_documents(p)]
    docs = load_yaml_documents(file)
    reports = validate_documents(docs, admin, labels, admission=Admission(labels))
    result = as_json([FileReport(str(file), reports)])
    if not result["valid"]:
        print_text([FileReport(str(file), reports)], err.console)
        raise typer.Exit(EXIT_INVALID)
    unjudged = [
        f"{i.path}: {i.message}"
        for r in reports
        for i in r.issues.warnings
        if "its DeviceClass is not in the input" in i.message
    ]
    skipped = [
        i
        for r in reports
        for i in r.issues.warnings
        if i.path.segments[-1:] == ("network",) and "not in the input" in i.message
    ]
    notes: list[str] = []
    try:
        attachments = plan_attachments(
            reports,
            default_pool(host),
            host=host,
            documents=docs,
            notes=notes,
            policy_documents=admin,
            namespace_labels=labels,
            node=_machine_links(notes),
        )
    except NoParent as exc:  # and a CNIIPPool not in the input (PoolNotInInput)
        raise usage_error(f"{file}: {exc}") from None
    except Refused as exc:
        for problem in exc.problems:
            err.print(f"[red]refused:[/] {escape(problem)}", highlight=False)
        err.print(
            escape(f"{file}: prepare refuses it (nothing was run)"), highlight=False, markup=False
        )
        raise typer.Exit(EXIT_INVALID) from None
    if not attachments:
        why = "; ".join(f"{i.path}: {i.message}" for i in skipped)
        raise usage_error(
            f"{file} has nothing to try: "
            + (
                f"its named networks are not in the input ({why}); put the CNINetwork or "
                "NetworkAttachmentDefinition in the same file"
                if skipped
                else "no requests for driver cni.dra.networking.x-k8s.io"
            )
        )
    clash = _one_pods_names(attachments)
    if clash:
        raise usage_error(f"{file}: {clash}")
    if os.geteuid() != 0 and not netns_path:
        raise usage_error(
            "cnidra try runs the plugins as the driver does, in network namespaces it creates, "
            "which needs root: run it with sudo (or as root in a container with CAP_NET_ADMIN)"
        )
    plan = TryPlan(attachments, host=host, keep=keep, pod_netns=netns_path, notes=notes)
    for note in notes:
        err.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    for request in unjudged:  # the class's CNIPolicy: prepare's first question
        err.print(
            f"[yellow]not judged:[/] {escape(request)}; try runs it, and prepare may refuse it",
            highlight=False,
        )
    where = "the host" if host else "a throwaway node namespace"
    err.print(f"[bold]ADD[/] {len(attachments)} attachment(s) in {where}", highlight=False)
    outcome = execute(plan, [p for p in cni_path.split(":") if p], state_dir, timeout)
    raise typer.Exit(_told(outcome, output))


def _machine_links(notes: list[str]) -> Any:
    """This machine's links as prepare judges a network's host-side effects against the node's
    (`cnidra.inventory.links.node_facts`); None, with a note, when they cannot be read."""
    from cnidra.inventory.links import node_facts, read_links

    try:
        return node_facts(read_links())
    except OSError as exc:
        notes.append(f"this machine's links could not be read ({exc}): host-side effects unjudged")
        return None


def _one_pods_names(attachments: Sequence[Any]) -> str | None:
    """try runs every claim of the input in one pod: two that name one interface are two
    pods' (a converted file's two workloads), which it cannot run together."""
    seen: dict[str, str] = {}
    for att in attachments:
        where = f"{att.claim.namespace}/{att.claim.name}"
        other = seen.setdefault(att.if_name, where)
        if other != where:
            return (
                f"claims {other} and {where} both name interface {att.if_name}: try runs one "
                "pod's claims (one workload's), each interface name once; give it one "
                "workload's claim template at a time"
            )
    return None


def _told(outcome: Any, output: str) -> int:
    """`cnidra try`'s outcome printed: the status on stdout, each attachment on stderr; the
    exit code."""
    status = {"status": {"devices": outcome.statuses}}
    if output == "json":
        typer.echo(json.dumps(status, indent=2))
    else:
        typer.echo(yaml.safe_dump(status, sort_keys=False), nl=False)
    for o in outcome.outcomes:
        mark = "[green]ready[/]" if o.ready else "[red]not ready[/]"
        detail = "" if o.ready else f": {o.error}"
        err.print(f"{mark} {escape(o.attachment.label + detail)}", highlight=False)
    for problem in outcome.cleanup_errors:
        err.print(f"[red]cleanup failed:[/] {escape(problem)}", highlight=False)
    if outcome.kept:
        err.print(escape("kept: " + ", ".join(outcome.kept)), highlight=False)
    elif outcome.ok:
        err.print("DEL done; nothing left behind", highlight=False)
    return 0 if outcome.ok and not outcome.cleanup_errors else EXIT_INVALID


def driver(**values: Any) -> None:
    """Run the node agent: kubelet DRA plugin, ResourceSlice publisher, health and metrics."""
    import asyncio

    from cnidra.agent.driver import run
    from cnidra.kube.client import ClientConfigError

    settings = settings_from_flags(DriverSettings, values)
    setup_logs(settings_from_flags(LogSettings, values))
    try:
        asyncio.run(run(settings))
    except ClientConfigError as exc:
        raise usage_error(f"cnidra driver: {exc}") from None


S = typing.TypeVar("S")


def settings_from_flags(cls: type[S], values: dict[str, Any]) -> S:
    """A settings class from the flags' values (lists split, "" read as the default where the
    field says so, choices and bounds checked as the chart's schema states them)."""
    defaults = cls()
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value = values[f.name]
        if f.metadata.get("sep"):
            value = [item for item in str(value).split(f.metadata["sep"]) if item]
        elif f.metadata.get("empty") and value in ("", None):
            value = getattr(defaults, f.name)
        value, problem = check(f, value)
        if problem:
            raise usage_error(f"{flag_of(f).split('/')[0]} {problem}")
        changes[f.name] = value
    return dataclasses.replace(defaults, **changes)  # type: ignore[type-var]


def settings_parameters(cls: type[Any]) -> list[inspect.Parameter]:
    """A command's parameters made from a settings class's fields: the one declaration of each
    setting (flag, CNIDRA_* variable, type, default, help)."""
    hints = typing.get_type_hints(cls)
    defaults = cls()
    params = []
    for f in dataclasses.fields(cls):
        kind: Any = hints[f.name]
        default = getattr(defaults, f.name)
        if f.metadata.get("sep"):
            kind, default = str, f.metadata["sep"].join(default)
        elif f.metadata.get("empty"):
            kind, default = str | None, None
        option = typer.Option(flag_of(f), envvar=env_of(f), help=f.metadata.get("help") or None)
        params.append(
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=Annotated[kind, option],
                default=inspect.Parameter.empty if f.metadata.get("required") else default,
            )
        )
    return params


def _driver_signature() -> inspect.Signature:
    params = settings_parameters(DriverSettings) + settings_parameters(LogSettings)
    return inspect.Signature(params, return_annotation=None)


driver.__signature__ = _driver_signature()  # type: ignore[attr-defined]
app.command()(driver)


def webhook(
    tls_cert: Annotated[Path, typer.Option("--tls-cert", envvar="CNIDRA_WEBHOOK_TLS_CERT")],
    tls_key: Annotated[Path, typer.Option("--tls-key", envvar="CNIDRA_WEBHOOK_TLS_KEY")],
    address: Annotated[
        str, typer.Option("--address", envvar="CNIDRA_WEBHOOK_ADDRESS")
    ] = "0.0.0.0:9443",
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            "--kubeconfig", envvar="CNIDRA_KUBECONFIG", help="default: in-cluster service account"
        ),
    ] = None,
    **logs: Any,
) -> None:
    """Serve the validating admission webhook for ResourceClaims and ResourceClaimTemplates
    (POST /validate, HTTPS): the same verdict as prepare, before any pod uses the claim."""
    from cnidra.admission.webhook import TTLCache, WebhookServer
    from cnidra.kube.client import device_class_reader, make_sync_client, namespace_labels_reader

    setup_logs(settings_from_flags(LogSettings, logs))
    for option, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if not path.is_file():
            raise usage_error(f"{option} {path}: no such file (the webhook's PEM certificate/key)")
    port = address.rpartition(":")[2]
    if not port.isdigit() or int(port) > 65535:
        raise usage_error(f"--address {address!r}: must be HOST:PORT, e.g. 0.0.0.0:9443")
    try:
        client = make_sync_client(kubeconfig)
    except Exception as exc:  # a kubeconfig that is missing or unreadable, no in-cluster config
        raise usage_error(f"cannot make an apiserver client ({exc})") from None
    server = WebhookServer(
        address,
        str(tls_cert),
        str(tls_key),
        TTLCache(device_class_reader(client)),
        TTLCache(namespace_labels_reader(client)),
    )
    import logging

    logging.getLogger(__name__).info("webhook serving on %s", address)
    server.serve_forever()


_webhook_own = [
    p
    for p in inspect.signature(webhook, eval_str=True).parameters.values()
    if p.kind is not p.VAR_KEYWORD
]
webhook.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [*_webhook_own, *settings_parameters(LogSettings)], return_annotation=None
)
app.command(short_help="Serve the validating admission webhook for claims.")(webhook)


@app.command("migrate-state", short_help="Move cnidra 0.1's state out of the shared CNI dir.")
def migrate_state(
    state_dir: Annotated[
        Path, typer.Option("--state-dir", envvar="CNIDRA_STATE_DIR")
    ] = DEFAULTS.state_dir,
    legacy_cni_dir: Annotated[
        Path, typer.Option("--legacy-cni-dir", envvar="CNIDRA_LEGACY_CNI_DIR")
    ] = DEFAULTS.legacy_cni_dir,
) -> None:
    """Move what cnidra 0.1 kept in the shared CNI directory under cnidra's state root (only
    attachments its sandbox records hold). Safe to run again; the driver also runs it."""
    from cnidra.state.layout import StateLayout
    from cnidra.state.migrate import migrate_legacy
    from cnidra.state.sandboxes import SandboxStore

    layout = StateLayout(state_dir)
    report = migrate_legacy(layout, legacy_cni_dir, SandboxStore(layout))
    typer.echo(str(report))


@app.command(
    "install-cni-plugins", short_help="Copy the bundled CNI reference plugins onto the node."
)
def install_cni_plugins(
    dest: Annotated[Path, typer.Option("--dest", help="the node's plugin directory")] = Path(
        "/opt/cni/bin"
    ),
    source: Annotated[Path, typer.Option("--source", help="the plugins the image bundles")] = Path(
        "/opt/cnidra/cni-plugins"
    ),
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="replace the node's own plugins of the same name")
    ] = False,
) -> None:
    """Copy the CNI reference plugins the image bundles onto the node (the chart's init step
    with cniPlugins.install). A plugin the node already has is kept unless --overwrite."""
    from cnidra.cni.install import install_plugins

    try:
        report = install_plugins(source, dest, overwrite=overwrite)
    except OSError as exc:
        raise usage_error(str(exc)) from None
    typer.echo(f"{dest}: {report}")


app.add_typer(
    node_app,
    name="node",
    short_help="Pod networks on this node, from the driver's node API (on the node, as root).",
)


def main() -> None:
    app()
