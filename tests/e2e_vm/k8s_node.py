"""The Kubernetes lab's control plane on the host, its node in the numa-vm guest: a real
kube-scheduler and nri-numa's scheduler extender choosing for a node with several real NUMA
nodes (tests/e2e_vm/test_k8s_node.py).

On the host, on 127.0.0.1 and in a folder of its own (`ControlPlane`, the host lab's `Lab` with
only its control plane: it claims nothing machine-wide, so the host lab may run beside it):
etcd, kube-apiserver (token auth, RBAC, no TaintNodesByCondition: no controller manager clears
the not-ready taint), `nri-numa scheduler-extender` (HTTPS, client certificates) and
kube-scheduler with the packaged KubeSchedulerConfiguration's extender pointed at it
(tests/e2e_k8s/extender_lab.py builds both). The guest reaches the apiserver through an ssh
reverse forward: `ssh -R 127.0.0.1:GUEST_APISERVER_PORT:127.0.0.1:<apiserver port>` binds only the
guest's loopback, and ssh connects only to the host's.

In the guest (tests/e2e_vm/guest_node.py): containerd 1.7.24 with runc's systemd driver,
`nri-numa run` exporting the node's NodeResourceTopology, and kubelet 1.20.2 with
`cgroupDriver: systemd` on cgroup v2, copied in over ssh from the machine's Kubernetes cache."""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import subprocess
import time
from pathlib import Path

import yaml

from tests.e2e_k8s.extender_lab import EXTENDER, SCHEDULER, LabCertificates, _answers, scheduler_config
from tests.e2e_k8s.kube import Kube
from tests.e2e_k8s.lab import (AGENT, NRT_CRD, NRT_CRD_NAME, K8sBinaries, Lab, _established, free_port)
from tests.e2e_vm.numa_vm import VmDir, guest_run

GUEST_APISERVER_PORT = 6443  # on the guest's 127.0.0.1
GUEST_KUBELET = "/usr/local/bin/kubelet"
TUNNEL = "guest-tunnel"
READY_S = 120.0


class ControlPlane(Lab):
    """etcd, kube-apiserver, the extender and kube-scheduler, by pid in ``<folder>/lab.json``;
    `down()` (the lab's) stops them, and `stop_tunnel()` the ssh forward."""

    def start(self, binaries: K8sBinaries) -> dict[str, float]:
        began = time.monotonic()
        figures: dict[str, float] = {}
        self.folder.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.recorded.ports = {name: free_port() for name in
                               ("etcd", "etcd-peer", "apiserver", "extender", "scheduler-health")}
        self.recorded.token = secrets.token_hex(16)
        self._save()
        self._write_credentials()
        kube = self.kube(binaries)
        etcd_url = f"http://127.0.0.1:{self.recorded.ports['etcd']}"
        peer_url = f"http://127.0.0.1:{self.recorded.ports['etcd-peer']}"
        self._start("etcd", [str(binaries.etcd), "--name", "vm-lab", "--data-dir", str(self.folder / "etcd"),
                             "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                             "--initial-cluster", f"vm-lab={peer_url}"])
        pki = self.folder / "pki"
        self._start("kube-apiserver", [
            str(binaries["kube-apiserver"]), f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1",
            f"--secure-port={self.recorded.ports['apiserver']}", "--insecure-port=0",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC", "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition", "--profiling=false"])
        self._wait(kube.readyz, READY_S, "kube-apiserver to answer /readyz ok", "kube-apiserver")
        kube.apply(yaml.safe_load_all(NRT_CRD.read_text()))
        self._wait(lambda: _established(kube, NRT_CRD_NAME), 30.0,
                   "the NodeResourceTopology CRD to be Established", "kube-apiserver")
        figures["apiserver_s"] = round(time.monotonic() - began, 1)
        self.certificates = LabCertificates(self.folder / "tls")
        self.start_extender()
        config = self.folder / "kube-scheduler.yaml"
        config.write_text(json.dumps(scheduler_config(
            self.kubeconfig, self.recorded.ports["extender"], self.recorded.ports["scheduler-health"],
            self.certificates.scheduler, self.certificates.server_ca.cert), indent=1) + "\n")
        self._start(SCHEDULER, [str(binaries["kube-scheduler"]), f"--config={config}", "--secure-port=0"])
        health = f"http://127.0.0.1:{self.recorded.ports['scheduler-health']}/healthz"
        self._wait(lambda: _answers(health), READY_S, "kube-scheduler (with the extender) to serve its health",
                   SCHEDULER)
        figures["control_plane_s"] = round(time.monotonic() - began, 1)
        return figures

    def start_extender(self) -> None:
        """`nri-numa scheduler-extender` on the plane's extender port, with the certificates
        `start` made; returns once it serves kube-scheduler's client certificate."""
        url = f"https://127.0.0.1:{self.recorded.ports['extender']}"
        self._start(EXTENDER, [str(AGENT), "scheduler-extender", "--listen", url.removeprefix("https://"),
                               "--kubeconfig", str(self.kubeconfig), *self.certificates.extender_args()])
        scheduler = ssl.create_default_context(cafile=str(self.certificates.server_ca.cert))
        scheduler.load_cert_chain(str(self.certificates.scheduler.cert), str(self.certificates.scheduler.key))
        self._wait(lambda: _answers(f"{url}/healthz", scheduler), READY_S, "the extender to serve", EXTENDER)

    def stop_extender(self) -> list[str]:
        """The extender stopped (SIGTERM); what could not be stopped. `start_extender` starts it
        again on the same port."""
        return self._stop(EXTENDER)

    def guest_kubeconfig(self) -> str:
        """The admin kubeconfig with the apiserver as the guest reaches it, and the lab's CA in
        it (its file is the host's)."""
        ca = self.folder / "pki" / "ca.crt"
        text = self.kubeconfig.read_text().replace(
            f"certificate-authority: {ca}",
            f"certificate-authority-data: {base64.b64encode(ca.read_bytes()).decode()}")
        return text.replace(self.server, f"https://127.0.0.1:{GUEST_APISERVER_PORT}")

    def start_tunnel(self, vm: VmDir) -> None:
        ssh = vm.ssh_command()
        self._start(TUNNEL, [*ssh[:-1], "-N", "-o", "ExitOnForwardFailure=yes", "-R",
                             f"127.0.0.1:{GUEST_APISERVER_PORT}:127.0.0.1:{self.recorded.ports['apiserver']}",
                             ssh[-1]])
        probe = ["python3", "-c", "import socket; socket.create_connection(('127.0.0.1', "
                                  f"{GUEST_APISERVER_PORT}), 5).close()"]
        self._wait(lambda: guest_run(vm, probe, check=False).returncode == 0, 60.0,
                   "the guest to reach the apiserver through the ssh forward", TUNNEL)

    def stop_tunnel(self) -> list[str]:
        if TUNNEL not in self.recorded.pids:
            return []
        problems = self._stop(TUNNEL)
        del self.recorded.pids[TUNNEL]
        self._save()
        return problems


def copy_kubelet(vm: VmDir, kubelet: Path) -> float:
    """The host's kubelet 1.20.2 into the guest (ssh; the guest has no shared folder)."""
    began = time.monotonic()
    with kubelet.open("rb") as binary:
        done = subprocess.run([*vm.ssh_command(), f"cat > {GUEST_KUBELET}.part && chmod 755 {GUEST_KUBELET}.part "
                                                  f"&& mv {GUEST_KUBELET}.part {GUEST_KUBELET}"],
                              stdin=binary, capture_output=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"copying the kubelet into the guest failed: {done.stderr.decode()[-400:]}")
    return round(time.monotonic() - began, 1)


def wait_node(kube: Kube, node: str, timeout_s: float) -> float:
    began = time.monotonic()
    while kube.node(node) is None:
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(f"node {node} did not register within {timeout_s:g} s")
        time.sleep(0.5)
    return round(time.monotonic() - began, 1)
