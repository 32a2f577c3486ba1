"""CRDs of other projects the test bed installs, as their upstream definitions have them."""

from __future__ import annotations

from typing import Any

# Multus' NetworkAttachmentDefinition (k8snetworkplumbingwg, the multi-net spec v1.3): v1,
# namespaced, short name net-attach-def, one field spec.config (a JSON string).
NAD_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "network-attachment-definitions.k8s.cni.cncf.io"},
    "spec": {
        "group": "k8s.cni.cncf.io",
        "scope": "Namespaced",
        "names": {
            "plural": "network-attachment-definitions",
            "singular": "network-attachment-definition",
            "kind": "NetworkAttachmentDefinition",
            "shortNames": ["net-attach-def"],
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "metadata": {"type": "object"},
                            "spec": {
                                "type": "object",
                                "properties": {"config": {"type": "string"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}
