# Links that are never a data NIC: container veths, other CNIs' bridges, gateways and tunnels
# (bridge CNI, docker, podman, kubenet, flannel, calico, cilium, kube-router, antrea, weave,
# OVN-Kubernetes and OVS, kube-proxy's IPVS dummy, NodeLocal DNSCache, libvirt).
DEFAULT_EXCLUDE = (
    r"^(veth.*|cni[0-9]+|cni-podman.*|podman[0-9]+|docker[0-9]+|cbr[0-9]+|flannel.*|cali.*"
    r"|vxlan\.calico|vxlan-v6\.calico|tunl[0-9]+|cilium.*|lxc.*|kube-.*|antrea-.*|weave"
    r"|datapath|vxlan-[0-9]+|ovn-k8s-.*|br-int|genev_sys_.*|vxlan_sys_.*|ovs-system"
    r"|nodelocaldns|virbr[0-9]+.*)$"
)
