"""Rendering of reports for people (rich) and machines (JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape

from cnidra.api.issues import Issue
from cnidra.api.validate import DocumentReport


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
    return {"valid": not errors, "errors": errors, "warnings": warnings, "skipped": skipped}


def print_text(files: list[FileReport], console: Console) -> None:
    for f in files:
        for d in f.documents:
            label = escape(f"{f.file} [{d.index}] {d.kind}" + (f"/{d.name}" if d.name else ""))
            if d.skipped and not d.issues.errors:
                console.print(f"[dim]skipped[/] {label}: {escape(d.skipped)}")
                continue
            if not d.issues.items:
                console.print(f"[green]ok[/]     {label}")
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
