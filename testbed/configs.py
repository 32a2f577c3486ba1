"""The components' configuration files: apiserver, kubelet, containerd (NRI, CDI), the primary
network's CNI config, and the test bed's own test plugins."""

from __future__ import annotations

import json

from testbed.layout import GATES, NODE1, PAUSE_IMAGE, SECOND_NODE_TAINT, Bins, Node, Paths
from testbed.pki import kubeconfig

PRIMARY_PLUGIN = "tb-primary"

SLOW_PLUGIN = "tb-sleepy"


def write_test_plugins(bins: Bins) -> None:
    """tb-primary: the primary network's bridge, recording every call (command, container,
    ifName, and the caller's name), so tests can prove nobody but containerd DELs it.
    tb-sleepy: ADD takes 30 s; every other command succeeds at once."""
    Paths.cni_bin.mkdir(parents=True, exist_ok=True)
    plugins = {
        PRIMARY_PLUGIN: f"""#!/bin/sh
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME $(cat /proc/$PPID/comm)" >> {Paths.primary_calls}
exec {bins.cni_plugins / "bridge"} "$@"
""",
        SLOW_PLUGIN: """#!/bin/sh
case "$CNI_COMMAND" in
  ADD) sleep 30; exit 1 ;;
  VERSION) echo '{"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}' ;;
  *) cat >/dev/null ;;
esac
""",
    }
    for name, text in plugins.items():
        path = Paths.cni_bin / name
        path.write_text(text)
        path.chmod(0o755)


def write_configs(bins: Bins) -> None:
    for d in (Paths.logs, Paths.pids, Paths.etc):
        d.mkdir(parents=True, exist_ok=True)
    for user in ("admin", "kubelet", "controller-manager", "scheduler"):
        kubeconfig(Paths.etc / f"{user}.kubeconfig", user)
    kubeconfig(Paths.admin_kubeconfig, "admin")
    write_test_plugins(bins)
    write_node_configs(bins, NODE1)


def write_node_configs(bins: Bins, node: Node) -> None:
    """The node's primary network conf, containerd's config and kubelet's."""
    for d in (
        node.run,
        node.plugins_registry,
        node.plugins,
        node.cni_conf,
        node.cni_data,
        node.root / "nri" / "conf.d",
        node.root / "nri" / "plugins",
    ):
        d.mkdir(parents=True, exist_ok=True)
    (node.cni_conf / "10-testbed.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "testbed-primary",
                "plugins": [
                    {
                        "type": PRIMARY_PLUGIN,
                        "bridge": node.bridge,
                        "isGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "dataDir": str(node.cni_data / "networks"),
                            "ranges": [[{"subnet": node.pod_subnet, "gateway": node.pod_gateway}]],
                        },
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}, "snat": False},
                ],
            },
            indent=2,
        )
    )
    (node.etc / "containerd.toml").write_text(f"""\
version = 3
root = '{node.root}/containerd'
state = '{node.run}/containerd'

[grpc]
  address = '{node.containerd_sock}'

[ttrpc]
  address = '{node.containerd_sock}.ttrpc'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{PAUSE_IMAGE}'

  [plugins.'io.containerd.cri.v1.runtime']
    # this machine withholds CAP_SYS_RESOURCE, so no process may lower its oom_score_adj
    # (kubelet asks -998 for sandboxes); clamp to containerd's own score instead
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    enable_cdi = true
    cdi_spec_dirs = ['{node.cdi}']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '{bins.runc / "runc"}'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{Paths.cni_bin}', '{bins.cni_plugins}']
      conf_dir = '{node.cni_conf}'

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'

  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = '{node.nri_sock}'
    plugin_path = '{node.root}/nri/plugins'
    plugin_config_path = '{node.root}/nri/conf.d'
    plugin_registration_timeout = '5s'
    plugin_request_timeout = '2s'
""")
    pki = Paths.pki
    (node.etc / "kubelet.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "address": node.ip,
                "port": 10250,
                "healthzBindAddress": "127.0.0.1",
                "readOnlyPort": 0,
                "authentication": {
                    "x509": {"clientCAFile": str(pki / "ca.crt")},
                    "webhook": {"enabled": True},
                    "anonymous": {"enabled": False},
                },
                "authorization": {"mode": "Webhook"},
                "tlsCertFile": str(pki / f"kubelet-serving{node.suffix}.crt"),
                "tlsPrivateKeyFile": str(pki / f"kubelet-serving{node.suffix}.key"),
                "cgroupDriver": "cgroupfs",
                "cgroupRoot": node.cgroup_root,
                # this machine has cgroup v1, which kubelet refuses from 1.35 on unless told so
                "failCgroupV1": False,
                "failSwapOn": False,
                "containerRuntimeEndpoint": f"unix://{node.containerd_sock}",
                "podLogsDir": str(node.root / "var" / "log" / "pods"),
                "volumePluginDir": str(node.root / "volume-plugins"),
                "staticPodPath": "",
                "evictionHard": {
                    "memory.available": "100Mi",
                    "nodefs.available": "1%",
                    "imagefs.available": "1%",
                },
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "featureGates": GATES,
                "serializeImagePulls": False,
                "maxPods": 250,
                "registerNode": True,
                "registerWithTaints": [SECOND_NODE_TAINT] if node != NODE1 else [],
                "resolvConf": "/etc/resolv.conf",
                "syncFrequency": "10s",
                "fileCheckFrequency": "10s",
                "nodeStatusUpdateFrequency": "5s",
            },
            indent=2,
        )
    )
