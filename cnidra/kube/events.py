"""The one Event recorder: core/v1 Events about any object kind (a Pod, a ResourceClaim, a
Node, an IPAMClaim), with the fields kubelet's own Events carry (client-go's legacy recorder):
firstTimestamp and lastTimestamp (when it happened, not when the apiserver took it: without
them `kubectl get events` shows `<unknown>`), count 1, source component and host, reporting
component and instance, and the involved object's kind, apiVersion, name, namespace, uid and
resourceVersion when known.

eventTime is left unset, as kubelet leaves it on core/v1 Events: the apiserver validates an
Event that has one as a new-style Event (an action required among others)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cnidra.kube.api import Api, Event

MAX_MESSAGE = 1024  # the apiserver's bound on an Event's message (note)

# kind -> its apiVersion, for the kinds cnidra reports on
API_VERSIONS = {
    "Pod": "v1",
    "Node": "v1",
    "ResourceClaim": "resource.k8s.io/v1",
}


@dataclass(frozen=True)
class Involved:
    """The object an Event is about. A cluster-scoped object (namespace "") has its Events in
    the default namespace."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = ""
    resource_version: str = ""

    @classmethod
    def of(cls, kind: str, api_version: str, obj: Mapping[str, Any]) -> Involved:
        """From an object as a dict (its metadata)."""
        meta = obj.get("metadata") or {}
        return cls(
            kind,
            str(meta.get("name") or ""),
            str(meta.get("namespace") or ""),
            str(meta.get("uid") or ""),
            api_version,
            str(meta.get("resourceVersion") or ""),
        )


@dataclass
class EventRecord:
    """One Event to write: what, about what, and when it happened."""

    about: Involved
    reason: str
    message: str
    type: str = "Normal"
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
    attempts: int = 0
    # a name every node gives the same Event (cnidra.status.netpolicy): the first node's create
    # makes it, the others' answer 409; "" has the apiserver generate one per report
    name: str = ""


class EventRecorder:
    """Builds and writes Events as `component` on `node` (their source host and reporting
    instance, as kubelet's)."""

    def __init__(self, component: str = "cnidra", node: str = "") -> None:
        self.component = component
        self.node = node

    def build(self, record: EventRecord) -> dict[str, Any]:
        """The Event as the apiserver takes it (its empty fields left out, as a typed
        client's serializer leaves them)."""
        about = record.about
        at = record.at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # RFC 3339
        involved = {
            "kind": about.kind,
            "apiVersion": about.api_version or API_VERSIONS.get(about.kind, "v1"),
            "name": about.name,
            "namespace": about.namespace or None,
            "uid": about.uid or None,
            "resourceVersion": about.resource_version or None,
        }
        source = {"component": self.component, "host": self.node or None}
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": _present(
                {
                    "name": record.name or None,
                    "generateName": None if record.name else f"{about.name}.",
                    "namespace": about.namespace or "default",
                }
            ),
            "involvedObject": _present(involved),
            "reason": record.reason,
            "message": record.message[:MAX_MESSAGE],
            "type": record.type,
            "source": _present(source),
            **_present(
                {"reportingComponent": self.component, "reportingInstance": self.node or None}
            ),
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
        }

    async def send(self, api: Api, record: EventRecord) -> None:
        """One create, with the Api's timeout; its failure is the Api's ApiFailure."""
        await api.create(Event, self.build(record))


def _present(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}
