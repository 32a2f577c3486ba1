"""`cnidra try` binds what it runs as prepare does: its attachments carry every field the
class's CNIPolicy decides through `resolve_attachment` (cnidra.dra.resolve.POLICY_BOUND), the
rate limit the policy sets among them (no root: the plan, not the run)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from cnidra.api.bandwidth import Rate
from cnidra.api.issues import Issues
from cnidra.api.refs import ObjectRef
from cnidra.api.validate import validate_documents
from cnidra.cli.try_ import HOST_LAYOUT, plan_attachments
from cnidra.dra.resolve import POLICY_BOUND, Device, resolve_attachment

ROOT = Path(__file__).parents[2]


def documents(bandwidth: dict[str, Any] | None) -> tuple[list[Any], list[Any]]:
    classes = list(yaml.safe_load_all((ROOT / "deploy" / "deviceclass.yaml").read_text()))
    classes = [copy.deepcopy(c) for c in classes if c]
    if bandwidth is not None:
        params = classes[0]["spec"]["config"][0]["opaque"]["parameters"]
        assert params["kind"] == "CNIPolicy"
        params["bandwidth"] = bandwidth
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / "macvlan-claim.yaml").read_text())]
    return classes, [d for d in docs if d]


def test_try_takes_the_policys_rate_as_prepare_does() -> None:
    classes, docs = documents({"whenUnreserved": "100M"})
    reports = validate_documents(docs, classes, {})
    [attachment] = plan_attachments(
        reports, "pool", documents=docs, policy_documents=classes, namespace_labels={}
    )
    assert attachment.rate == Rate(100 * 10**6, 100 * 10**6)
    [resolved] = [r for report in reports for r in report.resolved]
    verdict = resolve_attachment(
        resolved.judged,
        resolved.request,
        ObjectRef("default", "macvlan-data", ""),
        Device("pool", attachment.parent, link=attachment.parent),
        HOST_LAYOUT.private_dirs(),
        Issues(),
        resolved.where,
        namespace_labels={},
    )
    assert verdict is not None
    for name in POLICY_BOUND:
        assert getattr(attachment, name) == getattr(verdict, name), name


def test_without_a_policy_rate_try_runs_unlimited() -> None:
    classes, docs = documents(None)
    reports = validate_documents(docs, classes, {})
    [attachment] = plan_attachments(
        reports, "pool", documents=docs, policy_documents=classes, namespace_labels={}
    )
    assert attachment.rate is None
