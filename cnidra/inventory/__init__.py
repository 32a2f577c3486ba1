# Links that are never a data NIC: container veths, other CNIs' bridges and tunnels.
DEFAULT_EXCLUDE = r"^(veth.*|cni[0-9]+|docker[0-9]+|flannel.*|cali.*|cilium.*|kube-.*)$"
