"""etcd and a kube-apiserver v1.20.2 of their own on free 127.0.0.1 ports (the lab's cached
binaries; no kubelet, no containerd), with the NodeResourceTopology CRD and one Node: for the
NRT export bench and the extender's API tests."""

from __future__ import annotations

import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e_k8s.kube import ApiError, Kube
from tests.e2e_k8s.lab import NRT_CRD, LabUnavailable, find_binaries

NODE = "bench-node"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_api_server(folder: Path, users: dict[str, str] | None = None
                       ) -> Iterator[tuple[ApiServer, Kube]]:
    """An ApiServer started in ``folder`` with the default namespace's ServiceAccount (which
    the ServiceAccount admission plugin wants and no controller makes here); the test skips
    without the lab's binaries. Stopped afterwards."""
    try:
        find_binaries()
    except LabUnavailable as e:
        pytest.skip(f"no Kubernetes binaries: {e}")
    server = ApiServer(folder, users)
    try:
        kube = server.start()
        kube.request("POST", "/api/v1/namespaces/default/serviceaccounts",
                     {"apiVersion": "v1", "kind": "ServiceAccount",
                      "metadata": {"name": "default"}})
        yield server, kube
    finally:
        server.stop()


class ApiServer:
    """etcd and kube-apiserver on free 127.0.0.1 ports, in a folder of their own."""

    def __init__(self, folder: Path, users: dict[str, str] | None = None) -> None:
        """``users``: more static tokens, user name → token (RBAC decides what they may do; a
        ``system:serviceaccount:NS:NAME`` user is that ServiceAccount to RBAC)."""
        self.folder = folder
        self.children: list[subprocess.Popen] = []
        self.token = secrets.token_hex(16)
        self.users = users or {}
        self.port = free_port()
        self.kubeconfig = folder / "kubeconfig"

    def start(self) -> Kube:
        binaries = find_binaries()
        pki = self.folder / "pki"
        pki.mkdir(parents=True)
        (pki / "tokens.csv").write_text(
            f"{self.token},admin,admin,system:masters\n"
            + "".join(f'{token},{user},{user},"system:authenticated,system:serviceaccounts"\n'
                      for user, token in self.users.items()))
        subprocess.run(["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"], check=True,
                       capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out",
                        str(pki / "sa.pub")], check=True, capture_output=True)
        etcd_port, peer_port = free_port(), free_port()
        etcd_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        log = (self.folder / "servers.log").open("ab")
        for argv in ([str(binaries.etcd), "--name", "bench", "--data-dir", str(self.folder / "etcd"),
                      "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                      "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                      "--initial-cluster", f"bench={peer_url}"],
                     [str(binaries["kube-apiserver"]), f"--etcd-servers={etcd_url}",
                      "--bind-address=127.0.0.1", f"--secure-port={self.port}", "--insecure-port=0",
                      f"--cert-dir={pki / 'apiserver'}", f"--token-auth-file={pki / 'tokens.csv'}",
                      "--authorization-mode=RBAC", f"--service-account-key-file={pki / 'sa.pub'}",
                      f"--service-account-signing-key-file={pki / 'sa.key'}",
                      "--service-account-issuer=https://kubernetes.default.svc",
                      "--service-cluster-ip-range=10.0.0.0/24", "--profiling=false"]):
            self.children.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, cwd=self.folder))
        server = f"https://127.0.0.1:{self.port}"
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: b\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\n"
            f"users:\n- name: a\n  user:\n    token: {self.token}\n"
            "contexts:\n- name: b\n  context:\n    cluster: b\n    user: a\ncurrent-context: b\n")
        kube = Kube(server, self.token, binaries["kubectl"], self.kubeconfig)
        for user, token in self.users.items():
            self.user_kubeconfig(user).write_text(self.kubeconfig.read_text().replace(
                self.token, token))
        deadline = time.monotonic() + 60
        while not kube.readyz():
            if time.monotonic() > deadline:
                raise SystemExit(f"kube-apiserver not ready in 60 s: {self.folder / 'servers.log'}")
            time.sleep(0.2)
        import yaml

        kube.apply(yaml.safe_load_all(NRT_CRD.read_text()))
        kube.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                               "metadata": {"name": NODE}})
        while True:  # the CRD is served once Established
            try:
                kube.get("/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies")
                return kube
            except ApiError:
                time.sleep(0.2)

    def user_kubeconfig(self, user: str) -> Path:
        return self.folder / f"kubeconfig-{user.replace(':', '-')}"

    def stop(self) -> None:
        for child in reversed(self.children):
            child.kill()
            child.wait()
