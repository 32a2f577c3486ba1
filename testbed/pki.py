"""The test bed's certificates and kubeconfigs (openssl), made once under <root>/pki."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from testbed.layout import APISERVER_PORT, NODE, NODE_IP, SERVICE_IP, Node, Paths


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _cert(
    name: str,
    subject: str,
    sans: Sequence[str] = (),
    server: bool = False,
    pki: Path | None = None,
) -> None:
    pki = pki or Paths.pki
    key, csr, crt, ext = (pki / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    _openssl("genrsa", "-out", str(key), "2048")
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
    usage = "serverAuth" if server else "clientAuth"
    lines = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
    ]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(pki / "ca.crt"),
        "-CAkey",
        str(pki / "ca.key"),
        "-CAcreateserial",
        "-days",
        "3650",
        "-sha256",
        "-extfile",
        str(ext),
        "-out",
        str(crt),
    )
    csr.unlink()
    ext.unlink()


def make_pki(pki: Path | None = None) -> None:
    """The test bed's CA and certificates under <root>/pki; `pki`: the same set elsewhere
    (bench.fleet's own control plane)."""
    pki = pki or Paths.pki
    if (pki / ".complete").exists():
        return
    shutil.rmtree(pki, ignore_errors=True)
    pki.mkdir(parents=True, mode=0o700)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(pki / "ca.key"),
        "-out",
        str(pki / "ca.crt"),
        "-days",
        "3650",
        "-subj",
        "/CN=cnidra-testbed-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )
    _cert(
        "apiserver",
        "/CN=kube-apiserver",
        server=True,
        pki=pki,
        sans=[
            "IP:127.0.0.1",
            f"IP:{SERVICE_IP}",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ],
    )
    _cert(
        "kubelet-serving",
        f"/CN={NODE}",
        server=True,
        sans=["IP:127.0.0.1", f"IP:{NODE_IP}", f"DNS:{NODE}"],
        pki=pki,
    )
    _cert("admin", "/O=system:masters/CN=cnidra-testbed-admin", pki=pki)
    _cert("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", pki=pki)
    _cert("kubelet", f"/O=system:nodes/CN=system:node:{NODE}", pki=pki)
    _cert("controller-manager", "/CN=system:kube-controller-manager", pki=pki)
    _cert("scheduler", "/CN=system:kube-scheduler", pki=pki)
    _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    (pki / ".complete").touch()


def kubeconfig(path: Path, user: str, pki: Path | None = None, port: int = APISERVER_PORT) -> None:
    """A kubeconfig for `user`'s certificate; `pki` and `port`: another control plane's."""
    pki = pki or Paths.pki
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "testbed",
                "clusters": [
                    {
                        "name": "testbed",
                        "cluster": {
                            "server": f"https://127.0.0.1:{port}",
                            "certificate-authority": str(pki / "ca.crt"),
                        },
                    }
                ],
                "users": [
                    {
                        "name": user,
                        "user": {
                            "client-certificate": str(pki / f"{user}.crt"),
                            "client-key": str(pki / f"{user}.key"),
                        },
                    }
                ],
                "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": user}}],
            },
            indent=2,
        )
    )
    path.chmod(0o600)


def node_certs(node: Node) -> None:
    """The kubelet's serving certificate (for the apiserver's calls: exec, logs) and its
    client certificate as system:node:<name>, made once."""
    if not (Paths.pki / f"{node.kubelet_user}.crt").exists():
        _cert(
            f"kubelet-serving{node.suffix}",
            f"/CN={node.name}",
            server=True,
            sans=["IP:127.0.0.1", f"IP:{node.ip}", f"DNS:{node.name}"],
        )
        _cert(node.kubelet_user, f"/O=system:nodes/CN=system:node:{node.name}")
    kubeconfig(Paths.etc / f"{node.kubelet_user}.kubeconfig", node.kubelet_user)
