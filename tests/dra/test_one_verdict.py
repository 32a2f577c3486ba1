"""One verdict: `cnidra validate --policy`, the admission webhook and prepare call the same
function (`cnidra.api.verdict.check_request`) with the same bounds
(`cnidra.api.parameters`), so the same claim gets the same answer from all three. Checked here
over the hostile classes of tests/api/test_tenant.py and the differential fuzzer's inputs:
the claim as a tenant writes it, the webhook's AdmissionReview of it, and the allocation DRA
would make of it (the class's configs copied in as FromClass, the device on the link the
config names)."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from cnidra.admission.webhook import review
from cnidra.api.nodes import NodeView
from cnidra.api.ownership import PrivateDirs
from cnidra.api.refs import ObjectRef
from cnidra.api.validate import validate_documents
from cnidra.dra.prepare import PrepareError, resolve_claim
from tests.api.test_policy import DEFAULT_CLASSES, claim
from tests.api.test_tenant import DEFAULT_CLASS, RESTRICTED, RESTRICTED_CLASS
from tests.cni.test_decoders import EXAMPLES, tenant_config

CLASSES = {c["metadata"]["name"]: c for c in [*DEFAULT_CLASSES, RESTRICTED]}
DIRS = PrivateDirs(ipam="/state/ipam", tuning="/state/tuning")
REF = ObjectRef("team-a", "c", "uid-1")


def link_of(doc: dict[str, Any]) -> str:
    """The link DRA would allocate: the one the claim's network names, else link0."""
    params = doc["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    config = params.get("config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return "link0"
    plugins = config.get("plugins") if isinstance(config, dict) else None
    for plugin in plugins if isinstance(plugins, list) else [config]:
        if isinstance(plugin, dict):
            for key in ("master", "bridge", "device"):
                if isinstance(plugin.get(key), str) and plugin[key]:
                    return str(plugin[key])
    return "link0"


def allocated(doc: dict[str, Any], device_class: str, link: str) -> dict[str, Any]:
    """The claim as prepare reads it once the scheduler allocated `link` to its request."""
    out = copy.deepcopy(doc)
    cls = CLASSES[device_class]
    class_configs = [
        {**c, "source": "FromClass", "requests": ["net"]} for c in cls["spec"].get("config", [])
    ]
    claim_configs = [{**c, "source": "FromClaim"} for c in doc["spec"]["devices"]["config"]]
    out["metadata"]["uid"] = REF.uid
    out["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "net", "driver": "cni.dra.networking.x-k8s.io",
                     "pool": "node-1", "device": link}
                ],
                "config": class_configs + claim_configs,
            }
        }
    }  # fmt: skip
    return out


def verdicts(params: dict[str, Any], device_class: str) -> tuple[bool, bool, bool]:
    doc = claim(params, device_class)
    [report] = validate_documents([doc], list(CLASSES.values()), {})
    body = {"request": {"uid": "u", "operation": "CREATE", "namespace": "team-a", "object": doc}}
    webhook = review(body, CLASSES.get, lambda ns: {})["response"]["allowed"]
    link = link_of(doc)
    view = NodeView(links={link: link})  # which links carry the node is the node's to know
    try:
        resolve_claim(allocated(doc, device_class, link), REF, "node-1", DIRS, view, {})
        prepared = True
    except PrepareError:
        prepared = False
    return not report.issues.errors, webhook, prepared


@pytest.mark.parametrize(("what", "config", "where", "message"), DEFAULT_CLASS)
def test_hostile_claims_get_one_verdict(what: str, config: Any, where: str, message: str) -> None:
    for form in (config, json.dumps(config, ensure_ascii=False)):
        assert verdicts({"ifName": "net1", "config": form}, "cni.networking.x-k8s.io") == (
            False,
            False,
            False,
        )


@pytest.mark.parametrize(("what", "params", "where", "message"), RESTRICTED_CLASS)
def test_claims_outside_a_class_ranges_get_one_verdict(
    what: str, params: dict[str, Any], where: str, message: str
) -> None:
    assert verdicts(params, "restricted") == (False, False, False)


@settings(
    max_examples=max(EXAMPLES // 2, 50),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(config=tenant_config())
def test_the_fuzzers_claims_get_one_verdict(config: Any) -> None:
    for device_class in ("cni.networking.x-k8s.io", "restricted"):
        validate, webhook, prepare = verdicts({"ifName": "net1", "config": config}, device_class)
        assert validate == webhook == prepare, (validate, webhook, prepare, config)


CORPUS = Path(__file__).parents[1] / "corpus"
CONF_FILES = sorted(
    p for p in CORPUS.iterdir() if p.suffix in (".conf", ".conflist")
)  # the NAD files are checked as NADs by tests/api/test_corpus.py


@pytest.mark.parametrize("path", CONF_FILES, ids=lambda p: p.name)
def test_the_corpus_gets_one_verdict_as_a_tenants_claim(path: Path) -> None:
    """Each real-world config as a tenant's claim on the default class and on the restricted
    one, as text (the string form) and, where it is JSON, as an object."""
    text = path.read_text()
    forms: list[Any] = [text]
    with contextlib.suppress(ValueError):
        forms.append(json.loads(text))
    for form in forms:
        for device_class in ("cni.networking.x-k8s.io", "restricted"):
            validate, webhook, prepare = verdicts({"ifName": "net1", "config": form}, device_class)
            assert validate == webhook == prepare, (path.name, device_class, validate, prepare)
