"""Names and limits shared by every part of cnidra. Pure data, no I/O."""

from typing import Final

DRIVER_NAME: Final = "cni.dra.networking.x-k8s.io"
DEVICE_CLASS_NAME: Final = "cni.networking.x-k8s.io"

API_GROUP: Final = "cni.networking.x-k8s.io"
API_VERSION: Final = f"{API_GROUP}/v1alpha1"
KIND: Final = "CNIConfig"
LEGACY_KIND: Final = "CNI"  # the kind name of the upstream demo, accepted with a warning

RESOURCE_API_VERSIONS: Final = frozenset(
    {"resource.k8s.io/v1", "resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2"}
)

# CNI versions whose configs libcni and the plugins run, and whose results the runtime parses
# and converts (0.1.0 and 0.2.0 results, `ip4`/`ip6`, are read into the 1.0.0 form, as libcni
# converts them for its callers).
SUPPORTED_CNI_VERSIONS: Final = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
# A config without cniVersion is 0.1.0 to libcni.
DEFAULT_CNI_VERSION: Final = "0.1.0"

# The pod's primary network interface, owned by the cluster's default CNI.
PRIMARY_IFNAME: Final = "eth0"
# Linux IFNAMSIZ is 16 including the terminating NUL.
IFNAME_MAX_BYTES: Final = 15

# Limits of ResourceClaim status.devices[] enforced by the apiserver.
STATUS_DATA_MAX_BYTES: Final = 10 * 1024
STATUS_MAX_CONDITIONS: Final = 8
STATUS_MAX_IPS: Final = 16
STATUS_INTERFACE_NAME_MAX: Final = 256
STATUS_HARDWARE_ADDRESS_MAX: Final = 128

# Condition vocabulary of the ResourceClaim device status.
CONDITION_READY: Final = "Ready"
REASON_READY: Final = "NetworkInterfaceReady"
REASON_NOT_READY: Final = "NetworkInterfaceNotReady"
# the rate limit an attached interface is held to (issue 44): present only where one is
CONDITION_BANDWIDTH: Final = "BandwidthLimited"
REASON_BANDWIDTH: Final = "RateLimitApplied"
# network policy on the interface (issue 43): present where the interface is on a network a
# policy can name and the driver enforces policy; True only where the pod cannot undo it
CONDITION_POLICY: Final = "NetworkPolicyEnforced"
REASON_POLICY_POD_NAMESPACE: Final = "InPodNamespace"  # True: a table in the pod's namespace
REASON_POLICY_HOST_SIDE: Final = "OnHostSide"  # True: on the host's end of the pod's veth
REASON_POLICY_UNDOABLE: Final = "UndoableByPod"  # False: the pod has CAP_NET_ADMIN
REASON_POLICY_REFUSED: Final = "NotEnforceable"  # False: no kernel path to filter

# cnidra interfaces one pod may have: all are ADDed within one NRI hook, whose time is bounded.
DEFAULT_MAX_ATTACHMENTS: Final = 8

# Set by Kubernetes on a claim made from a template: the pod's own name for it
# (pod.spec.resourceClaims[].name).
POD_CLAIM_NAME_ANNOTATION: Final = "resource.kubernetes.io/pod-claim-name"
