"""The benchmarks' CNIIPPools, and the claims they send as the shipped policy judges them.

cnidra refuses host-local written by a tenant (a claim's own network): host-local keeps one
pool per network name and node, so two namespaces or two nodes on one L2 segment hand out the
same addresses (cnidra.api.policy.SEGMENT_BLIND_IPAM; docs/security.md, "Addresses are
owned"). A claim's network in a benchmark takes its addresses from cnidra's cluster IPAM
instead, `ipam: {type: cnidra, pool: NAME}`, from an admin's CNIIPPool made for the run (its
`namespaces` naming the claims' namespace; docs/ipam.md) and deleted after it, with the blocks
the node reserved in it. Each benchmark has a range of its own inside 198.18.0.0/15.

A benchmark that starts a driver says what it sends in `policy_samples()`: its claims or
templates (each with its namespace) and the pools they name, built by the functions it uses
itself; tests/bench/test_benches_ship.py judges them with the shipped DeviceClasses
(`cnidra.api.validate.validate_documents`) and checks the pools serve them and do not overlap
another benchmark's.
"""

from __future__ import annotations

import contextlib
import copy
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from cnidra.api.constants import API_VERSION
from cnidra.api.ipam import LABEL_POOL

if TYPE_CHECKING:
    from testbed.harness import Cluster


def pool_object(name: str, subnet: str, namespaces: list[str], **range_: Any) -> dict[str, Any]:
    """An admin's CNIIPPool of one range that serves the tenants of `namespaces`; `range_`
    adds fields of the range (gateway, rangeStart, rangeEnd)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "CNIIPPool",
        "metadata": {"name": name},
        "spec": {"ranges": [{"subnet": subnet, **range_}], "namespaces": list(namespaces)},
    }


def cnidra_ipam(pool: str) -> dict[str, Any]:
    """A plugin's `ipam` taking its addresses from `pool` at prepare."""
    return {"type": "cnidra", "pool": pool}


def pool_name(bench: str) -> str:
    """A pool of its own for one run of `bench`."""
    return f"bench-{bench.replace('_', '-')}-{uuid.uuid4().hex[:6]}"


def delete_pool(bed: Cluster, name: str) -> None:
    """The pool and the blocks nodes reserved in it (they are the Node's, not the pool's, so
    the pool's deletion leaves them)."""
    with contextlib.suppress(subprocess.SubprocessError):  # a cleanup: never raises
        bed.kubectl("delete", "cniippool", name, "--ignore-not-found", check=False)
        bed.kubectl("delete", "cniipblocks", "-l", f"{LABEL_POOL}={name}", check=False)


@contextmanager
def ip_pool(
    bed: Cluster, name: str, subnet: str, namespaces: list[str], **range_: Any
) -> Iterator[str]:
    """`pool_object` made for the block and deleted after it (whatever happens); its name."""
    try:
        bed.apply(pool_object(name, subnet, namespaces, **range_))
        yield name
    finally:
        delete_pool(bed, name)


def in_namespace(namespace: str, *docs: dict[str, Any]) -> list[dict[str, Any]]:
    """Copies of namespaced `docs` with metadata.namespace set (as `kubectl apply -n` makes
    them); cluster-scoped pools as they are."""
    out = []
    for doc in docs:
        made = copy.deepcopy(doc)
        if made.get("kind") != "CNIIPPool":
            made.setdefault("metadata", {})["namespace"] = namespace
        out.append(made)
    return out
