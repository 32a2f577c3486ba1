"""What the chart registers for admission cannot take the cluster down (issue 26): the webhook
sees only CREATEs of objects carrying a cnidra config outside the system namespaces, and the
tenant CEL policies judge only CREATEs, so a finalizer or status update (the scheduler's, the
claim controller's, the driver's) is never refused, whatever a namespace's labels became."""

from __future__ import annotations

from typing import Any

from tests.test_chart import docs


def rules(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] == "ValidatingWebhookConfiguration":
        return [r for hook in obj["webhooks"] for r in hook["rules"]]
    return list(obj["spec"]["matchConstraints"]["resourceRules"])


def test_the_webhook_sees_only_creates_of_cnidra_configs_outside_system_namespaces() -> None:
    [hook] = [
        h
        for d in docs("admission.webhook.enabled=true")
        if d["kind"] == "ValidatingWebhookConfiguration"
        for h in d["webhooks"]
    ]
    assert {op for r in hook["rules"] for op in r["operations"]} == {"CREATE"}
    assert hook["matchConditions"], "every claim in the cluster would be sent to it"
    excluded = {
        v
        for e in hook["namespaceSelector"]["matchExpressions"]
        if e["operator"] == "NotIn"
        for v in e["values"]
    }
    assert {"kube-system", "kube-public", "kube-node-lease"} <= excluded
    assert hook["failurePolicy"] in ("Fail", "Ignore") and hook["timeoutSeconds"] <= 10


def test_tenant_policies_judge_creates_only() -> None:
    policies = [d for d in docs() if d["kind"] == "ValidatingAdmissionPolicy"]
    assert policies
    for policy in policies:
        conditions = " ".join(c["expression"] for c in policy["spec"].get("matchConditions", []))
        for_the_driver = "serviceaccount" in conditions
        operations = {op for r in rules(policy) for op in r["operations"]}
        if not for_the_driver:  # a tenant's: a later update (finalizers, status) never judged
            assert operations == {"CREATE"}, policy["metadata"]["name"]
