"""Every setting of `cnidra driver`, declared once: its type, default and help live here, and
the CLI's flags and `CNIDRA_*` variables are made from these fields (cnidra.cli.main), so a new
setting is one line here (and a value in the chart, if operators should set it). Light to
import: no I/O, no gRPC."""

from __future__ import annotations

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
) -> T:
    """A field with what its flag needs: `flag` overrides the name made from the field's
    (`--sub-interfaces`, variable CNIDRA_SUB_INTERFACES); a list is one string joined by `sep`;
    `empty_is_default` reads "" as the default (the chart passes "" for "unchanged")."""
    meta: dict[str, Any] = {
        "help": help,
        "flag": flag,
        "sep": sep,
        "empty": empty_is_default,
        "required": required,
        "choices": choices,
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
    http_address: str = setting("127.0.0.1:9177", "host:port for /healthz and /metrics")
    sub_interfaces: int = setting(64, "pod interfaces one parent link may carry")
    include_interfaces: str = setting(".*", "regex of link names to publish")
    exclude_interfaces: str = setting(
        DEFAULT_EXCLUDE,
        'regex of link names never to publish ("": the built-in list)',
        empty_is_default=True,
    )
    resync_seconds: float = setting(60.0, "how often the slices are compared with the links")
    api_timeout: float = setting(10.0, "seconds for one apiserver call")
    nri_socket: str = setting("/var/run/nri/nri.sock", "containerd's NRI socket")
    nri_plugin_name: str = setting("cnidra", "the name containerd knows the NRI plugin by")
    nri_plugin_index: str = setting("50", "where the NRI plugin runs among others (00-99)")
    cni_timeout: float = setting(10.0, "seconds per plugin call")
    concurrent_attach: bool = setting(False, "ADD a pod's attachments at once instead of in order")
    attach_behind_sandbox: bool = setting(
        True,
        "start a pod's ADDs in RunPodSandbox and wait for them at its first CreateContainer "
        "(containerd runs all pods' NRI hooks one at a time), or do them inside RunPodSandbox",
        flag="--attach-behind-sandbox/--attach-in-sandbox-hook",
    )
    attach_budget: float = setting(
        0.0,
        "seconds all of a pod's ADDs may take; 0: 60% of the runtime's NRI request timeout "
        "(1.2 s with containerd's default 2 s)",
    )
    max_attachments: int = setting(
        DEFAULT_MAX_ATTACHMENTS,
        "cnidra interfaces one pod may have; prepare refuses more",
        flag="--max-attachments-per-pod",
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
    device_metadata: bool = setting(
        True,
        "write each claim's device metadata for its containers (KEP-5304, via CDI)",
        flag="--device-metadata/--no-device-metadata",
    )
    cdi_dir: Path = setting(Path("/var/run/cdi"), "where the runtime reads CDI specs")
    link_failure_taint: str = setting(
        "NoSchedule",
        "the device taint of a link that is down, lost its carrier or is gone (KEP-5055): "
        "NoSchedule, NoExecute (also evicts the pods using it), or None",
        choices=("NoSchedule", "NoExecute", "None"),
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
    )
    cni_conf_dir: Path = setting(
        Path("/etc/cni/net.d"),
        "node-local network confs, <NetworkID>.conflist/.conf (read, never written)",
    )
    network_status: bool = setting(
        True,
        "write Multus' k8s.v1.cni.cncf.io/network-status annotation on pods",
        flag="--network-status/--no-network-status",
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
