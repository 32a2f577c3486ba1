"""The `cnidra` command."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console

from cnidra.api.convert import ConvertError, OutputKind, read_source, render_yaml, to_document
from cnidra.api.validate import validate_documents
from cnidra.cli.output import FileReport, as_json, print_text

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="cnidra: secondary pod interfaces from CNI plugins, through DRA.",
)
err = Console(stderr=True, soft_wrap=True)

EXIT_INVALID = 1
EXIT_USAGE = 2


class Format(StrEnum):
    TEXT = "text"
    JSON = "json"


def usage_error(message: str) -> typer.Exit:
    err.print(f"[red]error:[/] {message}", highlight=False)
    return typer.Exit(EXIT_USAGE)


def load_yaml_documents(path: Path) -> list[object]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise usage_error(f"cannot read {path}: {exc.strerror}") from None
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise usage_error(f"{path} is not YAML: {exc}") from None


@app.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="YAML files (multi-document); - for stdin")],
    output: Annotated[Format, typer.Option("-o", "--output", help="text or json")] = Format.TEXT,
) -> None:
    """Check ResourceClaims, ResourceClaimTemplates, DeviceClasses and CNIConfigs."""
    reports = [FileReport(str(f), validate_documents(load_yaml_documents(f))) for f in files]
    result = as_json(reports)
    if output is Format.JSON:
        typer.echo(json.dumps(result, indent=2))
    else:
        print_text(reports, Console(soft_wrap=True))
    raise typer.Exit(0 if result["valid"] else EXIT_INVALID)


@app.command()
def convert(
    file: Annotated[
        Path, typer.Argument(help=".conf/.conflist JSON or a NetworkAttachmentDefinition YAML")
    ],
    kind: Annotated[
        OutputKind, typer.Option("--kind", help="what to produce")
    ] = OutputKind.TEMPLATE,
    name: Annotated[
        str | None, typer.Option("--name", help="object name (default: network name)")
    ] = None,
    if_name: Annotated[str, typer.Option("--if-name", help="interface name in the pod")] = "net1",
) -> None:
    """Print a CNI config file as YAML ready for kubectl apply."""
    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text()
    except OSError as exc:
        raise usage_error(f"cannot read {file}: {exc.strerror}") from None
    try:
        source = read_source(text)
    except ConvertError as exc:
        raise usage_error(f"{file}: {exc}") from None
    typer.echo(render_yaml(to_document(source, kind, name, if_name)), nl=False)


def main() -> None:
    app()
