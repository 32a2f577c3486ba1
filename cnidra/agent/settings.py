"""Every setting of `cnidra driver` (and the log settings of every long-running command),
declared once: its type, default, help, allowed values and whether the chart offers it live
here. From these fields come the CLI's flags and `CNIDRA_*` variables (cnidra.cli.main), the
`driver` section of the chart's values.schema.json and the table in docs/settings.md (both
written by hack/gen-settings.py; tests/test_settings.py fails when they differ). A new setting
is one field here (and, with `chart=True`, one line in values.yaml and the DaemonSet's args).
Light to import: no I/O, no gRPC."""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cnidra.api.constants import DEFAULT_MAX_ATTACHMENTS, DRIVER_NAME
from cnidra.inventory import DEFAULT_EXCLUDE
from cnidra.state.layout import DEFAULT_STATE_ROOT, LEGACY_CNI_DIR

T = TypeVar("T")


def setting(
    default: T,
    help: str = "",
    *,
    flag: str = "",
    sep: str = "",
    empty_is_default: bool = False,
    required: bool = False,
    choices: tuple[str, ...] = (),
    chart: bool = False,
    schema: dict[str, Any] | None = None,
) -> T:
    """A field with what its flag needs: `flag` overrides the name made from the field's
    (`--sub-interfaces`, variable CNIDRA_SUB_INTERFACES); a list is one string joined by `sep`;
    `empty_is_default` reads "" as the default (the chart passes "" for "unchanged");
    `choices` the values allowed (any case). `chart`: the chart offers it as
    `driver.<flag in camelCase>`; `schema`: more JSON Schema bounds (minimum, maximum,
    exclusiveMinimum, pattern), which the CLI checks too."""
    meta: dict[str, Any] = {
        "help": help,
        "flag": flag,
        "sep": sep,
        "empty": empty_is_default,
        "required": required,
        "choices": choices,
        "chart": chart,
        "schema": dict(schema or {}),
    }
    if isinstance(default, list):
        items = list(default)
        return field(default_factory=lambda: list(items), metadata=meta)  # type: ignore[return-value]
    return field(default=default, metadata=meta)


@dataclass
class DriverSettings:
    node_name: str = setting("", "this node's name (the pod's spec.nodeName)", required=True)
    kubeconfig: str | None = setting(None, "default: the in-cluster service account")
    plugins_registry_dir: Path = setting(
        Path("/var/lib/kubelet/plugins_registry"), "where kubelet finds plugins to register"
    )
    plugins_dir: Path = setting(Path("/var/lib/kubelet/plugins"), "kubelet's plugin sockets")
    state_dir: Path = setting(
        DEFAULT_STATE_ROOT, "cnidra's state root: checkpoint, sandbox records, CNI cache, IPAM"
    )
    legacy_cni_dir: Path = setting(
        LEGACY_CNI_DIR, "where cnidra 0.1 kept CNI state; read once to migrate it"
    )
    cni_path: list[str] = setting(["/opt/cni/bin"], "plugin directories", sep=":")
    http_address: str = setting(
        "127.0.0.1:9177",
        "host:port for /healthz and /metrics; the probes use it",
        chart=True,
        schema={"pattern": r"^[^:]+:[0-9]+$"},
    )
    sub_interfaces: int = setting(
        64, "pod interfaces one parent link may carry", chart=True, schema={"minimum": 1}
    )
    include_interfaces: str = setting(".*", "regex of link names to publish", chart=True)
    exclude_interfaces: str = setting(
        DEFAULT_EXCLUDE,
        'regex of link names never to publish ("": the built-in list)',
        empty_is_default=True,
        chart=True,
    )
    resync_seconds: float = setting(60.0, "how often the slices are compared with the links")
    api_timeout: float = setting(10.0, "seconds for one apiserver call")
    nri_socket: str = setting("/var/run/nri/nri.sock", "containerd's NRI socket")
    nri_plugin_name: str = setting("cnidra", "the name containerd knows the NRI plugin by")
    nri_plugin_index: str = setting(
        "50",
        "where the NRI plugin runs among others (00-99)",
        chart=True,
        schema={"pattern": "^[0-9]{2}$"},
    )
    cni_timeout: float = setting(
        10.0, "seconds per plugin call", chart=True, schema={"exclusiveMinimum": 0}
    )
    concurrent_attach: bool = setting(False, "ADD a pod's attachments at once instead of in order")
    attach_behind_sandbox: bool = setting(
        True,
        "start a pod's ADDs in RunPodSandbox and wait for them at its first CreateContainer "
        "(containerd runs all pods' NRI hooks one at a time), or do them inside RunPodSandbox",
        flag="--attach-behind-sandbox/--attach-in-sandbox-hook",
    )
    attach_budget: float = setting(
        0.0,
        "seconds all of a pod's ADDs may take; 0: behind the sandbox, the plugin timeout "
        "(--cni-timeout), and inside the sandbox hook 60% of the runtime's NRI request timeout "
        "(1.2 s with containerd's default 2 s), which also caps a larger value there",
        chart=True,
        schema={"minimum": 0},
    )
    max_attachments: int = setting(
        DEFAULT_MAX_ATTACHMENTS,
        "cnidra interfaces one pod may have; prepare refuses more",
        flag="--max-attachments-per-pod",
        chart=True,
        schema={"minimum": 1, "maximum": 64},
    )
    sweep_seconds: float = setting(10.0, "how often sandboxes that vanished are looked for")
    ipam_reconcile_seconds: float = setting(
        30.0, "how often cnidra IPAM frees addresses nobody holds (docs/ipam.md)"
    )
    ipam_lost_node_passes: int = setting(
        10, "reconcile passes between looks for lost nodes' IPAMClaims"
    )
    ipam_grace_seconds: float = setting(
        120.0, "how old an address of an unprepared claim must be before it is freed"
    )
    pool_accountant: bool = setting(
        True,
        "count each CNIIPPool's held and free addresses into its status and name an exhausted "
        "pool on Pending pods, in the one driver that holds the accountant Lease (docs/ipam.md)",
        flag="--pool-accountant/--no-pool-accountant",
    )
    pool_accountant_namespace: str = setting(
        "default", "the namespace of the pool accountant's Lease (the chart: the release's)"
    )
    pool_accountant_lease_seconds: float = setting(
        60.0,
        "how long the pool accountant's Lease lasts unrenewed: its holder renews it every third "
        "of it, the two successors it names ask for it once per duration and every other driver "
        "once per ten, so a dead accountant's work is taken over within about twice this "
        "(docs/ipam.md)",
        schema={"minimum": 3},
    )
    pool_status_seconds: float = setting(
        5.0,
        "how often lease counts are compared: a block's changed count is written to its status "
        "once settled (the same at two comparisons), a pool's status when changed (batched)",
        schema={"minimum": 0.5},
    )
    device_metadata: bool = setting(
        True,
        "write each claim's device metadata for its containers (KEP-5304, via CDI)",
        flag="--device-metadata/--no-device-metadata",
        chart=True,
    )
    cdi_dir: Path = setting(Path("/var/run/cdi"), "where the runtime reads CDI specs")
    link_failure_taint: str = setting(
        "NoSchedule",
        "the device taint of a link that is down, lost its carrier or is gone (KEP-5055): "
        "NoSchedule, NoExecute (also evicts the pods using it), or None",
        choices=("NoSchedule", "NoExecute", "None"),
        chart=True,
    )
    container_gate: bool = setting(
        True,
        "give every container of a claim a createRuntime hook that keeps it from starting "
        "before its pod's interfaces are attached (docs/fail-closed.md)",
        flag="--container-gate/--no-container-gate",
    )
    host_state_dir: str = setting(
        "",
        "the state root as the node sees it, where the gate's hook is run from "
        '("": the same as --state-dir)',
    )
    publish_node_links: list[str] = setting(
        [],
        "comma-separated links that carry the node (default route, node address) to publish "
        "anyway, marked nodeLink, for classes whose CNIPolicy names them",
        sep=",",
        chart=True,
    )
    cni_conf_dir: Path = setting(
        Path("/etc/cni/net.d"),
        "node-local network confs, <NetworkID>.conflist/.conf (read, never written)",
    )
    network_status: bool = setting(
        True,
        "write Multus' k8s.v1.cni.cncf.io/network-status annotation on pods",
        flag="--network-status/--no-network-status",
        chart=True,
    )
    network_policy: bool = setting(
        True,
        "enforce MultiNetworkPolicy and CNIAdminNetworkPolicy on cnidra interfaces (nftables in "
        "each pod's network namespace; watches policies, namespaces and pods cluster-wide)",
        flag="--network-policy/--no-network-policy",
        chart=True,
    )
    bridge_policy_on_host: bool = setting(
        True,
        "enforce network policy of bridge interfaces on the host (the pod's addresses in the "
        "node's inet hooks, its port held to its own addresses); turns on each policed bridge's "
        "own nf_call_iptables, so its traffic passes the node's forward chains; off: in the pod's "
        "network namespace, which a pod with CAP_NET_ADMIN can undo",
        flag="--bridge-policy-on-host/--no-bridge-policy-on-host",
        chart=True,
    )
    normal_events: str = setting(
        "added",
        "which Normal Events are written: added, an AddedInterface on the pod for each interface "
        "attached (the Events Multus writes; one apiserver request each); all, besides, "
        "RemovedInterface on pods and Prepared on claims (three requests a pod); none (not "
        "even an IPAMClaim's AddressesKept). Warnings are always written",
        choices=("added", "all", "none"),
        chart=True,
    )
    read_claims_ahead: bool = setting(
        True,
        "watch the node's pods still starting (fieldSelector spec.nodeName and "
        "status.phase=Pending) and read and judge a bound pod's claims before "
        "kubelet asks, so NodePrepareResources needs no GET; a claim not read ahead is a GET as "
        "without it",
        flag="--read-claims-ahead/--no-read-claims-ahead",
        chart=True,
    )
    claim_finalizer: str = setting(
        "on-failure",
        "when a claim gets cnidra's finalizer: on-failure (once a DEL of its interfaces fails; "
        "until then Kubernetes keeps the claim while its pod exists) or on-attach (from its "
        "first interface on, also against a pod deleted by force; two more requests per claim)",
        choices=("on-failure", "on-attach"),
        chart=True,
    )

    @property
    def registration_socket(self) -> Path:
        return self.plugins_registry_dir / f"{DRIVER_NAME}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.plugins_dir / DRIVER_NAME / "dra.sock"

    @property
    def plugin_data_dir(self) -> Path:
        return self.plugins_dir / DRIVER_NAME


DEFAULTS = DriverSettings()


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


@dataclass
class LogSettings:
    """How a long-running command (`cnidra driver`, `cnidra webhook`) logs."""

    log_level: str = setting(
        "info", "debug, info, warning or error", choices=LOG_LEVELS, chart=True
    )
    log_format: str = setting(
        "text",
        "text, or json: one object per line (Loki, Elasticsearch), with pod, claim and sandbox "
        "as fields where a line concerns them",
        choices=LOG_FORMATS,
        chart=True,
    )
    log_level_file: str = setting(
        "",
        "a file holding the log level, looked at every few seconds: a new level there applies "
        "without a restart (the chart mounts a ConfigMap made from driver.logLevel here)",
    )


LOG_DEFAULTS = LogSettings()
SETTINGS = (DriverSettings, LogSettings)
"""Every settings class: the driver takes both, the webhook LogSettings."""


def flag_of(f: dataclasses.Field[Any]) -> str:
    """The field's flag as declared (`--a/--no-a` for a switch)."""
    return str(f.metadata.get("flag") or "--" + f.name.replace("_", "-"))


def env_of(f: dataclasses.Field[Any]) -> str:
    return "CNIDRA_" + flag_of(f).split("/")[0].lstrip("-").replace("-", "_").upper()


def chart_key(f: dataclasses.Field[Any]) -> str:
    """The chart value under `driver.` (the flag in camelCase), or "" when the chart does not
    offer the setting (it sets the paths itself)."""
    if not f.metadata.get("chart"):
        return ""
    first, *rest = flag_of(f).split("/")[0].lstrip("-").split("-")
    return first + "".join(word.capitalize() for word in rest)


def check(f: dataclasses.Field[Any], value: Any) -> tuple[Any, str]:
    """The value the field takes (a choice in its declared case), or why it cannot: the same
    bounds the chart's schema states."""
    choices: tuple[str, ...] = f.metadata.get("choices") or ()
    if choices:
        match = [c for c in choices if c.lower() == str(value).lower()]
        if not match:
            return value, f"{value!r}: must be one of {', '.join(choices)}"
        value = match[0]
    bounds: dict[str, Any] = f.metadata.get("schema") or {}
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in bounds and value < bounds["minimum"]:
            return value, f"{value}: must be at least {bounds['minimum']}"
        if "maximum" in bounds and value > bounds["maximum"]:
            return value, f"{value}: must be at most {bounds['maximum']}"
        if "exclusiveMinimum" in bounds and value <= bounds["exclusiveMinimum"]:
            return value, f"{value}: must be more than {bounds['exclusiveMinimum']}"
    if "pattern" in bounds and isinstance(value, str) and not re.search(bounds["pattern"], value):
        return value, f"{value!r}: must match {bounds['pattern']}"
    return value, ""


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "string"}


def values_schema() -> dict[str, Any]:
    """The `driver` object of the chart's values.schema.json: one property per setting the chart
    offers, with the field's help, type, choices and bounds (and `extraArgs`, the chart's own)."""
    properties: dict[str, Any] = {}
    for cls in SETTINGS:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = chart_key(f)
            if not key:
                continue
            prop: dict[str, Any]
            if f.metadata.get("sep"):
                prop = {"type": "array", "items": {"type": "string"}}
            else:
                prop = {"type": _JSON_TYPES[hints[f.name]]}
            if f.metadata.get("choices"):
                prop["enum"] = list(f.metadata["choices"])
            prop.update(f.metadata.get("schema") or {})
            prop["description"] = f"{f.metadata['help']} ({flag_of(f).split('/')[0]})"
            properties[key] = prop
    properties["extraArgs"] = {
        "type": "array",
        "items": {"type": "string"},
        "description": "more flags for `cnidra driver`, as they are (docs/settings.md)",
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "the driver's settings the chart offers (docs/settings.md, generated "
        "from cnidra/agent/settings.py)",
        "properties": properties,
    }


def _shown(value: Any, sep: str) -> str:
    if isinstance(value, list):
        value = sep.join(value)
    if value is None or value == "":
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).replace("|", "\\|")


def docs_table() -> str:
    """docs/settings.md's table: every setting's flag, variable, chart value, default and help."""
    rows = [
        "| flag | variable | chart value | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for cls in SETTINGS:
        defaults = cls()
        for f in dataclasses.fields(cls):
            key = chart_key(f)
            default = (
                "(required)"
                if f.metadata.get("required")
                else _shown(getattr(defaults, f.name), f.metadata.get("sep") or ",")
            )
            help = str(f.metadata["help"]).replace("|", "\\|").replace("<", "\\<")
            choices = f.metadata.get("choices") or ()
            if not all(c in help for c in choices):
                help += f" (one of {', '.join(choices)})"
            rows.append(
                f"| `{flag_of(f)}` | `{env_of(f)}` | {f'`driver.{key}`' if key else '-'} "
                f"| `{default}` | {help} |"
            )
    return "\n".join(rows) + "\n"
