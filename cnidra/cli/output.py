"""Rendering of reports for people (rich) and machines (JSON), and the one `-o` option every
command takes: kubectl's names, `table`, `wide`, `json`, `yaml`, each command offering those
that apply to what it prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer

from cnidra.api.issues import Issue
from cnidra.api.validate import DocumentReport

if TYPE_CHECKING:  # rich loads when something is printed with it, not with the command
    from rich.console import Console


def escape(text: str) -> str:
    """rich's markup escape. rich (1.8 MiB resident) is imported by the first text a command
    prints with it, not by `cnidra` itself: `cnidra driver`, which prints none, runs on."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


class LazyConsole:
    """A rich Console made when first printed to (see escape), with these options."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            # no emoji codes: an IPv6 address is full of them (`2001:db8:a:b::1` has `:b:`)
            self._console = Console(**{"emoji": False, **self.options})
        return self._console

    def print(self, *objects: Any, **options: Any) -> None:
        self.console.print(*objects, **options)


OUTPUTS = ("table", "wide", "json", "yaml")
ALIASES = {"text": "table"}  # validate's older name, still taken (not shown)
WHAT = {"table": "a table", "wide": "more columns", "json": "JSON", "yaml": "YAML"}


def output_option(default: str, *allowed: str) -> Any:
    """`-o/--output` with the values of OUTPUTS this command can print (a value it cannot is a
    usage error naming those it can, exit 2)."""
    assert default in allowed and set(allowed) <= set(OUTPUTS)
    offered = [o for o in OUTPUTS if o in allowed]

    def parse(value: str) -> str:
        chosen = ALIASES.get(value.lower(), value.lower())
        if chosen not in offered:
            raise typer.BadParameter(f"{value!r}: this command prints {', '.join(offered)}")
        return chosen

    return typer.Option(
        default,
        "-o",
        "--output",
        parser=parse,
        metavar="[" + "|".join(offered) + "]",
        help="output: " + ", ".join(f"{o} ({WHAT[o]})" for o in offered),
    )


@dataclass
class FileReport:
    file: str
    documents: list[DocumentReport]


def as_json(files: list[FileReport]) -> dict[str, Any]:
    def entry(f: FileReport, d: DocumentReport, issue: Issue) -> dict[str, Any]:
        return {
            "file": f.file,
            "document": d.index,
            "kind": d.kind,
            "name": d.name,
            "path": str(issue.path),
            "message": issue.message,
        }

    errors = [entry(f, d, i) for f in files for d in f.documents for i in d.issues.errors]
    warnings = [entry(f, d, i) for f in files for d in f.documents for i in d.issues.warnings]
    skipped = [
        {"file": f.file, "document": d.index, "kind": d.kind, "name": d.name, "why": d.skipped}
        for f in files
        for d in f.documents
        if d.skipped
    ]
    selections = [
        {"file": f.file, "document": d.index, "kind": d.kind, "name": d.name, "selects": d.selects}
        for f in files
        for d in f.documents
        if d.selects is not None
    ]
    out = {"valid": not errors, "errors": errors, "warnings": warnings, "skipped": skipped}
    if selections:  # network policies: the interfaces of the input each selects
        out["selections"] = selections
    return out


def print_text(files: list[FileReport], console: Console, wide: bool = False) -> None:
    """One line per document (ok, invalid, skipped) and its issues; `wide` adds what each
    request of ours resolved to: its interface name, network and plugin chain."""
    for f in files:
        for d in f.documents:
            label = escape(f"{f.file} [{d.index}] {d.kind}" + (f"/{d.name}" if d.name else ""))
            if d.skipped and not d.issues.errors:
                console.print(f"[dim]skipped[/] {label}: {escape(d.skipped)}")
                continue
            if not d.issues.items:
                console.print(f"[green]ok[/]     {label}")
                print_selects(d, console)
                if wide:
                    print_requests(d, console)
                continue
            state = "[red]invalid[/]" if d.issues.errors else "[yellow]ok[/]    "
            console.print(f"{state} {label}")
            for issue in d.issues.errors:
                console.print(
                    f"  [red]error[/]   {escape(f'{issue.path}: {issue.message}')}", highlight=False
                )
            for issue in d.issues.warnings:
                console.print(
                    f"  [yellow]warning[/] {escape(f'{issue.path}: {issue.message}')}",
                    highlight=False,
                )
            print_selects(d, console)
            if wide and not d.issues.errors:
                print_requests(d, console)


def print_selects(d: DocumentReport, console: Console) -> None:
    """A network policy's selection among the input's pods (nothing for other documents)."""
    if d.selects is None:
        return
    if not d.selects:
        console.print("  selects no interface of the input's pods", highlight=False)
    for line in d.selects:
        console.print(f"  selects {line}", highlight=False, markup=False)


def print_requests(d: DocumentReport, console: Console) -> None:
    for r in d.resolved:
        c = r.config
        name = c.if_name or (f"{c.if_name_prefix}N" if c.if_name_prefix else "netN (by the rule)")
        if c.network is not None:
            network = "network " + str(c.network.model_dump(exclude_none=True))
        else:
            conf = c.config or {}
            chain = [str(p.get("type")) for p in conf.get("plugins", [conf]) if isinstance(p, dict)]
            network = f"network {conf.get('name', '?')}, plugins {' -> '.join(chain)}"
        console.print(f"  request {r.request}: {name}, {network}", highlight=False, markup=False)
