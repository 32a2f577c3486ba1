"""`-o` is one vocabulary (kubectl's: table, wide, json, yaml), each command offering the values
that fit what it prints; `cnidra node` prints each of them from a real node API socket."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from cnidra.cli.main import app
from cnidra.nodeapi.service import NodeNetworksService, serve
from tests.nodeapi.test_node_api import records, three_pods
from tests.nri.fakes import Node

EXAMPLE = str(Path(__file__).parents[1] / "examples" / "two-networks-claim.yaml")


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


@pytest.mark.parametrize(
    ("command", "offered"),
    [
        (["validate", EXAMPLE], ["table", "wide", "json", "yaml"]),
        (["convert", EXAMPLE], ["json", "yaml"]),
        (["try", EXAMPLE], ["json", "yaml"]),
        (["node", "pods"], ["table", "wide", "json", "yaml"]),
        (["node", "describe", "p"], ["table", "wide", "json", "yaml"]),
        (["node", "events"], ["table", "wide", "json", "yaml"]),
    ],
)
def test_one_vocabulary_and_a_value_that_does_not_fit_is_a_usage_error(
    command: list[str], offered: list[str]
) -> None:
    help = cli(*command[:2], "--help").output
    assert "[" + "|".join(offered) + "]" in help
    for value in {"table", "wide", "json", "yaml", "xml"} - set(offered):
        wrong = cli(*command, "-o", value)
        assert wrong.exit_code == 2, (command, value, wrong.output)
        assert f"this command prints {', '.join(offered)}" in wrong.output
        assert "Traceback" not in wrong.output


def test_validate_wide_shows_what_each_request_resolved_to() -> None:
    out = cli("validate", "-o", "wide", EXAMPLE)
    assert out.exit_code == 0, out.output
    assert "request data: data0, network data, plugins macvlan" in out.output
    assert cli("validate", "-o", "text", EXAMPLE).output == cli("validate", EXAMPLE).output


async def test_node_commands_print_every_output(tmp_path: Path) -> None:
    node = Node.start(tmp_path)
    await three_pods(node)
    socket = tmp_path / "node.sock"
    server = await serve(NodeNetworksService(lambda: records(node), node.lifecycle.journal), socket)

    async def run(*args: str) -> str:
        result = await asyncio.to_thread(cli, "node", *args, "--socket", str(socket))
        assert result.exit_code == 0, result.output
        return str(result.output)

    try:
        table, wide = await run("pods"), await run("pods", "-o", "wide")
        assert "SANDBOX" not in table and "NETWORKS" in wide and "CLAIMS" in wide
        listed = json.loads(await run("pods", "-o", "json"))
        assert listed == yaml.safe_load(await run("pods", "-o", "yaml"))
        assert {p["pod"]["uid"] for p in listed} == {"a-uid", "b-uid", "c-uid"}
        described = await run("describe", "a", "-n", "ns", "-o", "wide")
        assert "Interfaces:" in described
        one = json.loads(await run("describe", "a", "-n", "ns", "-o", "json"))
        assert one["pod"]["name"] == "a"
        lines = (await run("events", "-o", "json")).splitlines()
        docs = [d for d in yaml.safe_load_all(await run("events", "-o", "yaml")) if d]
        assert [json.loads(line)["kind"] for line in lines] == [d["kind"] for d in docs]
        assert "sandbox" in (await run("events", "-o", "wide")).splitlines()[0]
    finally:
        await server.stop(grace=None)


def test_an_ipv6_address_is_printed_as_written_not_as_emoji(tmp_path: Path) -> None:
    """rich turns `:b:` into an emoji unless told not to: `2001:db8:a:b::1` has one."""
    pool = {
        "apiVersion": "cni.networking.x-k8s.io/v1alpha1",
        "kind": "CNIIPPool",
        "metadata": {"name": "p"},
        "spec": {
            "ranges": [{"subnet": "2001:db8:c::/64"}],
            "reservations": [{"address": "2001:db8:a:b::1", "pod": "ns/db-0"}],
        },
    }
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(pool))
    for args in (["validate", str(path)], ["validate", "-o", "wide", str(path)]):
        result = cli(*args)
        assert result.exit_code == 1, result.output
        assert "2001:db8:a:b::1 is not in the pool's ranges" in result.output, result.output


def test_try_refuses_two_pods_claims_naming_one_interface(tmp_path: Path) -> None:
    """A converted file's two workloads each name net1: try runs one pod's claims, so it says
    so (before anything runs) instead of failing in the plugin."""
    docs = [d for d in yaml.safe_load_all(Path(EXAMPLE).read_text()) if d]
    [claim] = [d for d in docs if d["kind"] == "ResourceClaim"]
    other = yaml.safe_load(yaml.safe_dump(claim))
    other["metadata"]["name"] = "second"
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([*docs, other]))
    result = cli("try", str(path))
    assert result.exit_code == 2, result.output
    assert "both name interface" in result.output and "one workload's" in result.output
