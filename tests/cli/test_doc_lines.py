"""The lines of docs/troubleshooting.md, docs/upgrading.md and docs/security.md that say what
the commands and the driver do (issue 41), each run or read back against the code."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"


def test_troubleshootings_log_lines_are_what_the_driver_logs_before_it_reads_its_node(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """'it has not read its Node object yet (...: its log says `...`, or `...`)'."""
    from cnidra.inventory.publisher import SlicePublisher
    from cnidra.inventory.slices import SliceSettings
    from cnidra.kube.session import ApiStatus

    text = " ".join((DOCS / "troubleshooting.md").read_text().split())
    said = text[text.index("it has not read its Node object yet") :].split(")", 1)[0]
    shown = re.findall(r"`([^`]+)`", said)
    assert len(shown) == 2, said

    class Client:
        def __init__(self) -> None:
            self.reads = 0

        async def get(self, kind: object, name: str) -> object:
            self.reads += 1
            if self.reads == 1:
                raise ApiStatus(404, f'nodes "{name}" not found')
            if self.reads == 2:
                raise ApiStatus(403, "forbidden")
            return {"metadata": {"labels": {}, "uid": "uid"}, "status": {"addresses": []}}

    async def scenario() -> None:
        publisher = SlicePublisher(Client(), SliceSettings("n1"), [])  # type: ignore[arg-type]
        task = asyncio.create_task(publisher._node_owner())
        try:
            await asyncio.wait_for(asyncio.shield(task), 30)  # two retries, ~0.6 s: a hang's bound
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await task

    with caplog.at_level(logging.WARNING, logger="cnidra"):
        asyncio.run(scenario())
    logged = [r.getMessage() for r in caplog.records]
    for line in shown:
        pattern = re.escape(line.replace("NODE", "n1")).replace(re.escape("..."), ".+")
        assert any(re.fullmatch(pattern, m) for m in logged), (line, logged)


def test_upgradings_validate_of_a_claims_directory_runs(tmp_path: Path) -> None:
    """`cnidra validate --policy <(helm template ... deviceclasses.yaml) my-claims/`: the
    classes through a pipe, the claims as a directory (deploy/deviceclass.yaml is the chart's
    classes rendered with its defaults)."""
    text = (DOCS / "upgrading.md").read_text()
    assert "cnidra validate --policy <(helm template" in text and ") my-claims/" in text
    claims = tmp_path / "my-claims"
    claims.mkdir()
    for name in ("macvlan-claim.yaml", "two-networks-claim.yaml", "dual-stack-pool.yaml"):
        shutil.copy(EXAMPLES / name, claims / name)
    if shutil.which("bash") is None:
        pytest.skip("no bash for the process substitution")
    script = (
        f"{sys.executable} -m cnidra validate -o json "
        f"--policy <(cat {ROOT / 'deploy' / 'deviceclass.yaml'}) {claims}/"
    )
    out = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert '"valid": true' in out.stdout


def test_securitys_offline_verdict_names_the_namespace_labels() -> None:
    """'`cnidra validate --policy deviceclasses.yaml --namespace-labels k=v,...` gives the same
    verdict offline, the ... claim-config=true label ... included' (the verdict itself:
    tests/cli/test_validate_try_inputs.py)."""
    text = " ".join((DOCS / "security.md").read_text().split())
    assert "--namespace-labels k=v,...` (the namespace's labels) gives the same verdict" in text
    assert "`claim-config=true` label below included" in text
    assert "`--namespace-annotation cni.networking.x-k8s.io/device-classes=...`" in text
