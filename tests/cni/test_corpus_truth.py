"""The corpus verdicts are the real plugins' verdicts: every `run: true` entry of
tests/corpus/index.yaml is ADDed with the reference plugins in throwaway namespaces (parents are
stand-in veths, addresses moved into 198.18.0.0/15 and 2001:db8::/32), without cnidra's
validator in the way: the valid ones come up (and go), the broken ones fail in the plugin."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cnidra.api.convert import read_sources
from cnidra.api.netconf import to_conflist
from cnidra.api.ownership import owned_network
from cnidra.api.refs import ObjectRef
from cnidra.cli.try_ import _pod_namespace, safe_node
from cnidra.cni import netns
from cnidra.cni.attach import AttachFailed, Attachment, attach_all, detach_all
from cnidra.cni.runtime import CNIRuntime
from cnidra.state.layout import StateLayout
from tests.conftest import CNITools

pytestmark = pytest.mark.netns
CORPUS = Path(__file__).parents[1] / "corpus"
RUN = [e for e in yaml.safe_load((CORPUS / "index.yaml").read_text()) if e.get("run")]


def in_test_ranges(text: str) -> str:
    text = re.sub(r"\b10\.\d+\.", "198.18.", text)
    return text.replace("2001:4860:", "2001:db8:")


def attachment(entry: dict[str, Any]) -> Attachment:
    text = in_test_ranges((CORPUS / entry["file"]).read_text())
    [source] = read_sources(text, entry["file"])
    conflist = to_conflist(source.config)
    return Attachment(
        ObjectRef("corpus", "c", "u"), "r", "net1", conflist, "corpus", "d", network_label="x"
    )


@pytest.mark.parametrize("entry", RUN, ids=[e["file"] for e in RUN])
def test_the_real_plugins_agree(entry: dict[str, Any], cni_tools: CNITools) -> None:
    raw = attachment(entry)
    with safe_node([raw], keep=False) as (node, scratch):
        layout = StateLayout(scratch)
        network = owned_network(raw.network, str(raw.network["name"]), layout.private_dirs())
        att = Attachment(raw.claim, raw.request, raw.if_name, network, raw.pool, raw.device)
        runtime = CNIRuntime([cni_tools.plugins], str(layout.cni_cache), timeout=30)
        with netns.entered(node), _pod_namespace(None, keep=False) as pod:

            async def run() -> str | None:
                try:
                    await attach_all(runtime, [att], "corpus", str(pod))
                except AttachFailed as failed:
                    return str(failed)
                assert not await detach_all(runtime, [att], "corpus", str(pod))
                return None

            failure = asyncio.run(run())
    if entry["expect"] == "valid":
        assert failure is None, failure
    else:
        assert failure is not None, f"{entry['file']} came up, but cnidra refuses it"
