"""The cost of judging one tenant's config at the bounds the readers admit, through the three
judges: `cnidra validate` (the YAML read, `validate_documents`, the JSON output), the admission
webhook (the AdmissionReview read, `review`, the answer written) and prepare (`resolve_claim`
on the allocated claim, a fresh `VerdictCache`).

    python -m bench.judge [--only a,b] [--timeout 180] [--list] [--json]

Each case is a config of at most `cnidra.api.parameters.MAX_BYTES` (64 KiB as compact JSON)
and `MAX_DEPTH` (32) levels, filled to the bound with its worst shape: identical and distinct
host-local ranges, thousands of plugins, thousands of keys, nesting at the depth bound, a
DeviceClass locking thousands of paths against a claim writing thousands, a claim with the
most requests and configs DRA allows, and, for `cnidra validate` alone, a multi-document file.
Every (case, judge) pair runs in a process of its own: once timed, then once under tracemalloc
for the peak of what the judgement allocated (the input built beforehand is not counted).
Goal: under 0.5 s and 100 MB each. Not a test: it prints figures (a table, or --json).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cnidra.api.parameters import MAX_BYTES, MAX_DEPTH

DRIVER = "cni.dra.networking.x-k8s.io"
API = "cni.networking.x-k8s.io/v1alpha1"
CLASS = "bench-judge.networking.x-k8s.io"
NAMESPACE = "team-a"
MAX_REQUESTS = 32  # DRA's bound on a claim's requests, and on its configs
OPAQUE_MAX = 10 * 1024  # the apiserver's bound on one opaque config's parameters
MULTI_DOCUMENTS = 200  # claims of each kind in the multi-document file
POLICY: dict[str, Any] = {
    "apiVersion": API,
    "kind": "CNIPolicy",
    "claims": {
        "defineNetworks": True,
        "plugins": ["macvlan", "ipvlan", "bridge", "tuning", "host-local", "static"],
        "fields": ["args"],
        "ipRanges": ["198.18.0.0/15"],
    },
}
JUDGES = ("validate", "webhook", "prepare")
GOAL_S = 0.5
GOAL_MB = 100.0


@dataclass
class Case:
    """One claim (and its DeviceClass): the configs each request gets."""

    what: str
    claim: list[dict[str, Any]]  # the claim's CNIConfig parameters, one config per request
    locked: list[dict[str, Any]] = field(default_factory=list)  # the class's configs
    documents: int = 0  # > 0: a multi-document file of this many claims (validate only)
    policy: dict[str, Any] = field(default_factory=lambda: POLICY)  # the class's CNIPolicy

    def judges(self) -> tuple[str, ...]:
        return ("validate",) if self.documents else JUDGES


def size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def filled(make: Callable[[int], dict[str, Any]], room: int = MAX_BYTES) -> dict[str, Any]:
    """`make(n)` for the largest n whose parameters fit the bound (bisection)."""
    low, high = 1, 1
    while size(make(high)) <= room:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if size(make(mid)) <= room else (low, mid)
    return make(low)


def params(config: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": API, "kind": "CNIConfig", **extra}
    if config is not None:
        out["config"] = config
    return out


def conflist(*plugins: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "n", **extra, "plugins": list(plugins)}


def macvlan(**fields: Any) -> dict[str, Any]:
    return {"type": "macvlan", **fields}


def host_local(ranges: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "host-local", "ranges": [ranges]}


def distinct(i: int) -> dict[str, Any]:
    return {"subnet": f"198.18.{i // 64}.{i % 64 * 4}/30"}


def nested(depth: int, bottom: dict[str, Any]) -> dict[str, Any]:
    for _ in range(depth):
        bottom = {"a": bottom}
    return bottom


def _identical(n: int) -> dict[str, Any]:
    return params(conflist(macvlan(ipam=host_local([{"subnet": "198.18.0.0/24"}] * n))))


def _distinct(n: int) -> dict[str, Any]:
    return params(conflist(macvlan(ipam=host_local([distinct(i) for i in range(n)]))))


def _tuning(n: int) -> dict[str, Any]:
    return params(conflist(macvlan(), *[{"type": "tuning"}] * n))


def _makers(n: int) -> dict[str, Any]:
    return params(conflist(*[{"type": "macvlan"}] * n))


def _keys(n: int) -> dict[str, Any]:
    return params(conflist(macvlan(**{f"k{i}": 0 for i in range(n)})))


def _deep(n: int, prefix: str = "k", network: bool = True) -> dict[str, Any]:
    # parameters > config > a: the chain fills the depth, the bottom object's values at the bound
    bottom = {f"{prefix}{i}": 0 for i in range(n)}
    config = conflist(macvlan()) if network else {}
    return params({**config, "a": nested(MAX_DEPTH - 4, bottom)})


def _policy(claims: Callable[[int], dict[str, Any]]) -> Callable[[int], dict[str, Any]]:
    return lambda n: {**POLICY, "claims": {**POLICY["claims"], **claims(n)}}


def _allowed(n: int) -> dict[str, Any]:  # ranges the tenant's addresses are not in
    return {"ipRanges": [f"10.{i // 16384}.{i // 64 % 256}.{i % 64 * 4}/30" for i in range(n)]}


def _vlan_ids(n: int) -> dict[str, Any]:  # every other VLAN ID
    return {"vlanIDs": [str(2 * i + 1) for i in range(n)]}


def _addresses(n: int) -> dict[str, Any]:
    static = [{"address": f"198.18.{i // 250}.{i % 250 + 1}/16"} for i in range(n)]
    return params(conflist(macvlan(ipam={"type": "static", "addresses": static})))


def _trunks(n: int) -> dict[str, Any]:
    return params(conflist({"type": "bridge", "vlanTrunk": [{"id": 2 * i + 2} for i in range(n)]}))


def _args(n: int, prefix: str = "K") -> dict[str, Any]:
    return params(args={f"{prefix}{i}": "v" for i in range(n)})


def _header(n: int, prefix: str = "x") -> dict[str, Any]:
    return params({f"{prefix}{i}": 0 for i in range(n)})


def cases() -> dict[str, Case]:
    static = {"type": "static", "addresses": [{"address": "198.18.0.5/24"}]}
    small = params(conflist(macvlan(ipam=static)), ifName="net1")
    only_name = params(ifName="net1")
    locked_args = filled(_args)
    claim_args = filled(lambda n: {**_args(n, "J"), "config": small["config"]})
    locked_config = filled(_header)
    claim_config = filled(lambda n: params({**conflist(macvlan()), **_header(n, "y")["config"]}))
    at_bound = filled(_tuning, MAX_BYTES - size({"ifName": "net32"}))
    apiserver = filled(_tuning, OPAQUE_MAX - size({"ifName": "net32"}))
    return {
        "ordinary": Case("an ordinary claim: macvlan, static IPAM (valid)", [small]),
        "identical_ranges": Case(
            "the claim's host-local: one range, as often as fits", [filled(_identical)]
        ),
        "claim_ranges": Case("the claim's host-local: distinct /30 ranges", [filled(_distinct)]),
        "distinct_ranges": Case(
            "the class's host-local: distinct /30 ranges, the claim names it (valid)",
            [only_name],
            [filled(_distinct, MAX_BYTES - size(only_name))],  # merged, they fit the bound
        ),
        "many_plugins": Case("macvlan then tuning plugins (valid)", [filled(_tuning)]),
        "many_makers": Case("macvlan plugins: each a second interface", [filled(_makers)]),
        "many_keys": Case("one plugin with unknown keys", [filled(_keys)]),
        "deep_nesting": Case(
            f"class and claim write keys at depth {MAX_DEPTH} under one chain",
            [filled(_deep)],
            [filled(lambda n: _deep(n, "j", network=False))],
        ),
        "locked_args": Case(
            "class locks args keys; the claim writes as many others", [claim_args], [locked_args]
        ),
        "locked_config": Case(
            "class locks config keys; the claim writes as many others",
            [claim_config],
            [locked_config],
        ),
        "policy_ranges": Case(
            "class allows /30 ranges; the claim's static addresses lie outside them",
            [filled(_addresses)],
            policy=filled(_policy(_allowed)),
        ),
        "policy_vlans": Case(
            "class allows odd VLAN IDs; the claim's bridge trunks even ones",
            [filled(_trunks)],
            policy=filled(_policy(_vlan_ids)),
        ),
        "max_claim": Case(
            f"{MAX_REQUESTS} requests, each its own 10 KiB config (the apiserver's bounds)",
            [apiserver] * MAX_REQUESTS,
        ),
        "max_claim_64k": Case(
            f"{MAX_REQUESTS} requests, each its own config at cnidra's 64 KiB bound",
            [at_bound] * MAX_REQUESTS,
        ),
        "multi_document": Case(
            "cnidra validate: classes, claims (ours, NADs', another driver's), NADs, pods",
            [small] * 4,
            documents=MULTI_DOCUMENTS,
        ),
    }


# ----------------------------------------------------------------------------- the documents


def device_class(locked: list[dict[str, Any]], policy: dict[str, Any] = POLICY) -> dict[str, Any]:
    configs = [{"opaque": {"driver": DRIVER, "parameters": p}} for p in [policy, *locked]]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"config": configs},
    }


def named(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each request's config with an interface name of its own (net1, net2...)."""
    if len(configs) < 2:
        return configs
    return [{**p, "ifName": f"net{i + 1}"} for i, p in enumerate(configs)]


def resource_claim(case: Case, name: str = "c") -> dict[str, Any]:
    requests = [f"r{i}" for i in range(len(case.claim))]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [{"name": r, "exactly": {"deviceClassName": CLASS}} for r in requests],
                "config": [
                    {"requests": [r], "opaque": {"driver": DRIVER, "parameters": p}}
                    for r, p in zip(requests, named(case.claim), strict=True)
                ],
            }
        },
    }


def allocated(case: Case) -> dict[str, Any]:
    """The claim as prepare reads it: DRA copied the class's configs in (FromClass)."""
    requests = [f"r{i}" for i in range(len(case.claim))]
    configs = [
        {"source": "FromClass", "requests": [r], "opaque": {"driver": DRIVER, "parameters": p}}
        for r in requests
        for p in [case.policy, *case.locked]
    ]
    configs += [
        {"source": "FromClaim", "requests": [r], "opaque": {"driver": DRIVER, "parameters": p}}
        for r, p in zip(requests, named(case.claim), strict=True)
    ]
    return {
        "metadata": {"uid": "uid-1", "generation": 1, "name": "c", "namespace": NAMESPACE},
        "spec": resource_claim(case)["spec"],
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": DRIVER, "pool": "n1", "device": f"eth{i}"}
                        for i, r in enumerate(requests)
                    ],
                    "config": configs,
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["n1"]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}],
        },
    }


def validate_input(case: Case) -> bytes:
    """The file `cnidra validate` reads: the DeviceClass, the claim(s) (JSON is YAML)."""
    docs = [device_class(case.locked, case.policy)]
    docs += many(case) if case.documents else [resource_claim(case)]
    return "\n---\n".join(json.dumps(d) for d in docs).encode()


def many(case: Case) -> list[dict[str, Any]]:
    """`case.documents` of each: DeviceClasses, claims of ours naming them, claims referencing
    a NetworkAttachmentDefinition, the NADs, claims of another driver, and pods with two
    claims each (their interfaces named across claims)."""
    n = case.documents
    static = {"type": "static", "addresses": [{"address": "198.18.0.7/24"}]}
    nad_config = json.dumps(conflist(macvlan(ipam=static)))
    docs: list[dict[str, Any]] = []
    for i in range(n):
        cls = {**device_class(case.locked), "metadata": {"name": f"class-{i}.example.com"}}
        ours = resource_claim(case, f"c{i}")
        for request in ours["spec"]["devices"]["requests"]:
            request["exactly"]["deviceClassName"] = cls["metadata"]["name"]
        by_nad = resource_claim(Case("", [params(network={"attachmentDefinition": f"nad-{i}"})]))
        by_nad["metadata"]["name"] = f"n{i}"
        nad = {
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": f"nad-{i}", "namespace": NAMESPACE},
            "spec": {"config": nad_config},
        }
        theirs = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"gpu-{i}", "namespace": NAMESPACE},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]
                }
            },
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p{i}", "namespace": NAMESPACE},
            "spec": {
                "containers": [{"name": "c", "image": "pause"}],
                "resourceClaims": [
                    {"name": "a", "resourceClaimName": f"c{i}"},
                    {"name": "b", "resourceClaimName": f"n{i}"},
                ],
            },
        }
        docs += [cls, ours, by_nad, nad, theirs, pod]
    return docs


# ----------------------------------------------------------------------------- the judges


def judge(case: Case, which: str) -> Callable[[], dict[str, Any]]:
    """A function judging the case as `which` does, from its input bytes (or dict) to its
    output; it returns what was found."""
    if which == "validate":
        from cnidra.api.loading import load_yaml
        from cnidra.api.validate import validate_documents
        from cnidra.cli.output import FileReport, as_json

        data = validate_input(case)

        def run_validate() -> dict[str, Any]:
            reports = validate_documents(load_yaml(data, "bench.yaml"))
            text = json.dumps(as_json([FileReport("bench.yaml", reports)]))
            errors = sum(len(r.issues.errors) for r in reports)
            return {"input_bytes": len(data), "errors": errors, "output_bytes": len(text)}

        return run_validate
    if which == "webhook":
        from cnidra.admission.webhook import review
        from cnidra.api.loading import load_json

        review_body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "operation": "CREATE",
                "namespace": NAMESPACE,
                "object": resource_claim(case),
            },
        }
        raw = json.dumps(review_body).encode()
        classes = {CLASS: device_class(case.locked, case.policy)}

        def run_webhook() -> dict[str, Any]:
            answer = review(load_json(raw, "the AdmissionReview"), classes.get, lambda ns: {})
            text = json.dumps(answer)
            allowed = answer["response"]["allowed"]
            return {"input_bytes": len(raw), "allowed": allowed, "output_bytes": len(text)}

        return run_webhook
    from cnidra.api.nodes import NodeView
    from cnidra.api.ownership import PrivateDirs
    from cnidra.api.refs import ObjectRef
    from cnidra.dra.prepare import PrepareError, resolve_claim
    from cnidra.dra.verdicts import VerdictCache

    claim = allocated(case)
    links = {f"eth{i}": f"eth{i}" for i in range(len(case.claim))}
    view = NodeView(links=links, protected=frozenset({"lo0"}))
    dirs = PrivateDirs(ipam="/state/ipam", tuning="/state/tuning")
    ref = ObjectRef(NAMESPACE, "c", "uid-1")

    def run_prepare() -> dict[str, Any]:
        try:
            prepared = resolve_claim(
                copy.deepcopy(claim), ref, "n1", dirs, view, verdicts=VerdictCache()
            )
        except PrepareError as exc:
            return {"input_bytes": size(claim), "prepared": False, "output_bytes": len(str(exc))}
        return {"input_bytes": size(claim), "prepared": True, "devices": len(prepared.devices)}

    return run_prepare


def measure(name: str, which: str) -> None:
    """In a process of its own: the time, then the peak memory, each a JSON line at once."""
    warm = cases()["ordinary"]
    for each in warm.judges():  # schemas loaded, validators compiled: not this case's cost
        judge(warm, each)()
    run = judge(cases()[name], which)
    gc.collect()
    start = time.perf_counter()
    found = run()
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": round(seconds, 4), **found}), flush=True)
    gc.collect()
    tracemalloc.start()
    run()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(json.dumps({"peak_mb": round(peak / 2**20, 2)}), flush=True)


def child(name: str, which: str, timeout: float) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.judge", "--child", name, which]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        out, err, code = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err, code = f"timed out after {timeout:.0f} s", None
    result: dict[str, Any] = {}
    for line in out.splitlines():
        if line.startswith("{"):
            result.update(json.loads(line))
    if code != 0:
        result["failed"] = err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
    return result


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    rows = [f"{'case':<18} {'judge':<9} {'seconds':>9} {'peak MB':>9}  notes"]
    for name, judged in results.items():
        for which, r in judged.items():
            seconds = f"{r['seconds']:.3f}" if "seconds" in r else "-"
            peak = f"{r['peak_mb']:.1f}" if "peak_mb" in r else "-"
            over = r.get("seconds", 0) > GOAL_S or r.get("peak_mb", 0) > GOAL_MB
            notes = [f"{r['input_bytes']:,} B in"] if "input_bytes" in r else []
            if "errors" in r:
                notes.append(f"{r['errors']:,} errors")
            for key in ("allowed", "prepared"):
                if key in r:
                    notes.append(f"{key} {str(r[key]).lower()}")
            if "output_bytes" in r:
                notes.append(f"{r['output_bytes']:,} B out")
            if "failed" in r:
                notes.append(str(r["failed"]))
            flag = " OVER" if over or "failed" in r else ""
            rows.append(f"{name:<18} {which:<9} {seconds:>9} {peak:>9}{flag:5} {', '.join(notes)}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", help="cases, comma-separated")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per case and judge")
    parser.add_argument("--list", action="store_true", help="the cases, and what each is")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "JUDGE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        measure(*args.child)
        return 0
    every = cases()
    if args.list:
        for name, case in every.items():
            print(f"{name:<18} {case.what}")
        return 0
    chosen = [n for n in (args.only.split(",") if args.only else every) if n]
    unknown = [n for n in chosen if n not in every]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; --list shows them")
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name in chosen:
        results[name] = {w: child(name, w, args.timeout) for w in every[name].judges()}
        if not args.json:
            print(table({name: results[name]}).split("\n", 1)[1], flush=True)
    worst_s = max((r.get("seconds", 0.0) for j in results.values() for r in j.values()), default=0)
    worst_mb = max((r.get("peak_mb", 0.0) for j in results.values() for r in j.values()), default=0)
    failed = [f"{n}/{w}" for n, j in results.items() for w, r in j.items() if "failed" in r]
    summary = {
        "worst_seconds": worst_s,
        "worst_peak_mb": worst_mb,
        "goal_seconds": GOAL_S,
        "goal_peak_mb": GOAL_MB,
        "failed": failed,
    }
    if args.json:
        print(json.dumps({"cases": results, **summary}))
    else:
        print(table(results))
        print(
            f"worst: {worst_s:.3f} s, {worst_mb:.1f} MB (goal: {GOAL_S} s, {GOAL_MB:.0f} MB each)"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
