"""Every setting of `cnidra driver`, with its default: the one place defaults live (the CLI's
flags and `CNIDRA_*` variables read them from here). Light to import: no I/O, no gRPC."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cnidra.api.constants import DEFAULT_MAX_ATTACHMENTS, DRIVER_NAME
from cnidra.inventory import DEFAULT_EXCLUDE
from cnidra.state.layout import DEFAULT_STATE_ROOT, LEGACY_CNI_DIR


@dataclass
class DriverSettings:
    node_name: str
    kubeconfig: str | None = None
    plugins_registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    state_dir: Path = DEFAULT_STATE_ROOT
    legacy_cni_dir: Path = LEGACY_CNI_DIR
    cni_path: list[str] = field(default_factory=lambda: ["/opt/cni/bin"])
    http_address: str = "127.0.0.1:9177"
    sub_interfaces: int = 64
    include_interfaces: str = ".*"
    exclude_interfaces: str = DEFAULT_EXCLUDE
    resync_seconds: float = 60.0
    api_timeout: float = 10.0
    nri_socket: str = "/var/run/nri/nri.sock"
    nri_plugin_name: str = "cnidra"
    nri_plugin_index: str = "50"
    cni_timeout: float = 10.0
    concurrent_attach: bool = False
    # ADDs behind the sandbox: RunPodSandbox answers at once, CreateContainer waits for them
    attach_behind_sandbox: bool = True
    attach_budget: float = 0.0
    max_attachments: int = DEFAULT_MAX_ATTACHMENTS
    sweep_seconds: float = 10.0
    # cnidra IPAM's reconciler: a pass this often (unprepared claims' and deleted IPAMClaims'
    # addresses), lost nodes' blocks every `ipam_lost_node_passes` passes
    ipam_reconcile_seconds: float = 30.0
    ipam_lost_node_passes: int = 10
    # an address leased for a claim that is not in the checkpoint is freed after this long
    # (longer than any prepare in flight)
    ipam_grace_seconds: float = 120.0
    # device metadata for containers (KEP-5304): CDI specs go where the runtime reads them
    device_metadata: bool = True
    cdi_dir: Path = Path("/var/run/cdi")
    # links that carry the node (default route, node address) published anyway, for admin
    # classes whose CNIPolicy names them in nodeLinks
    publish_node_links: list[str] = field(default_factory=list)
    # node-local network confs, by NetworkID (CNINetwork spec.networkID, a class's network)
    cni_conf_dir: Path = Path("/etc/cni/net.d")
    # write Multus' k8s.v1.cni.cncf.io/network-status annotation on pods with cnidra interfaces
    network_status: bool = True

    @property
    def registration_socket(self) -> Path:
        return self.plugins_registry_dir / f"{DRIVER_NAME}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.plugins_dir / DRIVER_NAME / "dra.sock"

    @property
    def plugin_data_dir(self) -> Path:
        return self.plugins_dir / DRIVER_NAME


DEFAULTS = DriverSettings(node_name="")
