"""No traceback, ever, from any CLI command: hypothesis feeds every subcommand garbage files
(text, bytes, deep or huge YAML and JSON, Kubernetes-shaped objects with wrong values), wrong
flags and missing paths; each answer is a message and a documented exit code (0, 1, 2)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cnidra.cli.main import app

RUNNER = CliRunner()
EXIT_CODES = {0, 1, 2}

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
KINDS = ["ResourceClaim", "ResourceClaimTemplate", "DeviceClass", "CNIConfig", "CNINetwork",
         "CNIIPPool", "NetworkAttachmentDefinition", "Pod", "Deployment", "List",
         "CronJob"]  # fmt: skip
VERSIONS = ["resource.k8s.io/v1", "v1", "apps/v1", "cni.networking.x-k8s.io/v1alpha1",
            "k8s.cni.cncf.io/v1"]  # fmt: skip
NETWORKS = "k8s.v1.cni.cncf.io/networks"


@st.composite
def k8s_objects(draw: st.DrawFn) -> Any:
    obj: dict[str, Any] = {
        "apiVersion": draw(st.sampled_from(VERSIONS)),
        "kind": draw(st.sampled_from(KINDS)),
        "metadata": draw(st.one_of(values, st.fixed_dictionaries({"name": st.text(max_size=10)}))),
        "spec": draw(values),
    }  # fmt: skip
    if draw(st.booleans()):
        obj["spec"] = {"devices": {"requests": draw(values), "config": draw(values)},
                       "config": draw(st.one_of(st.text(max_size=40), values)),
                       "template": {"metadata": {"annotations": {
                           NETWORKS: draw(st.text(max_size=30))}}}}  # fmt: skip
    return obj


def contents() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=200),
        st.text(max_size=200).map(str.encode),
        values.map(lambda v: json.dumps(v).encode()),
        st.lists(k8s_objects(), min_size=1, max_size=3).map(
            lambda docs: yaml.safe_dump_all(docs).encode()
        ),
        st.integers(1, 3000).map(lambda n: ("[" * n + "]" * n).encode()),
        st.integers(1, 3000).map(lambda n: ("a:\n" + "  " * 0 + "- " * n + "x").encode()),
    )


FLAGS = {
    "validate": [[], ["-o", "json"], ["-o", "yaml"], ["-o", "xml"], ["--policy", "{missing}"],
                 ["--namespace-labels", "a=b,,=c"], ["--policy", "{file}"]],
    "convert": [[], ["--kind", "CNIConfig"], ["--kind", "Nope"], ["--reference"],
                ["--name", "x"], ["-o", "json"], ["-o", "table"], ["--if-name", "bad name"]],
    "try": [["-o", "xml"], ["--netns", "{missing}"], ["-o", "json"]],
}  # fmt: skip


def run(args: list[str]) -> Any:
    result = RUNNER.invoke(app, args, catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args}: {result.exception!r}\n{result.output}") from result.exception
    assert result.exit_code in EXIT_CODES, (args, result.exit_code, result.output)
    assert "Traceback" not in result.output, (args, result.output)
    return result


@pytest.mark.slow  # 150 runs of the CLI
@settings(
    max_examples=int(os.environ.get("CNIDRA_CLI_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    command=st.sampled_from(sorted(FLAGS)),
    content=contents(),
    flags=st.data(),
)
def test_no_subcommand_answers_garbage_with_a_traceback(
    tmp_path: Path, command: str, content: bytes, flags: st.DataObject
) -> None:
    path = tmp_path / "input.yaml"
    path.write_bytes(content)
    chosen = flags.draw(st.sampled_from(FLAGS[command]))
    args = [a.format(missing=tmp_path / "missing.yaml", file=path) for a in chosen]
    if command == "try":
        args += ["--netns", str(tmp_path / "missing")] if "--netns" not in args else []
    run([command, *args, str(path)])


def test_missing_paths_directories_and_bad_flags_are_usage_errors(tmp_path: Path) -> None:
    for args in (
        ["validate", str(tmp_path / "missing.yaml")],
        ["validate", str(tmp_path)],
        ["convert", str(tmp_path / "missing.yaml")],
        ["convert", str(tmp_path)],
        ["try", str(tmp_path / "missing.yaml")],
        ["validate", "--no-such-flag", "x"],
        ["node", "describe"],
        ["node", "pods", "-o", "xml"],
        ["webhook", "--tls-cert", str(tmp_path / "none")],
        ["driver", "--no-such-flag"],
        ["no-such-command"],
    ):
        result = run(args)
        assert result.exit_code == 2, (args, result.output)
