"""The lab's kube-scheduler with nri-numa's scheduler extender, over the lab's real node and a few
virtual nodes (tests/e2e_k8s/test_scheduler_extender.py, and `scripts/k8s-lab up DIR
--scheduler-extender`; docs/scheduler-extender.md has this as its worked example).

`ExtenderLab(lab).up()` starts, as processes of the lab (logs in ``<folder>/logs``):

- ``virtual-nodes``: ``python -m nri_numa.cluster.virtual_nodes`` keeping `VIRTUAL_NODES`
  Ready and publishing their node state (no kubelet: pods bound there never run);
- ``nri-numa-extender``: ``nri-numa scheduler-extender`` on a free 127.0.0.1 port, over HTTPS
  with client certificates (a server CA and a client CA made with openssl in ``<folder>/tls``);
- kube-scheduler again, with ``--config`` naming a KubeSchedulerConfiguration whose
  ``extenders`` entry is packaging/kubernetes/kube-scheduler-config.yaml's, pointed at that port
  and at the lab's certificate files.

`down()` puts the lab's own kube-scheduler back and stops the other two (the keeper deletes its
nodes and the pods bound to them), so the lab's other tests see the lab they always saw.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from nri_numa.cluster.nrt import GROUP, PLURAL, VERSION
from tests.certificates import KeyPair, make_ca, make_signed
from tests.e2e.harness.runtimes import REPO
from tests.e2e_k8s.kube import ApiError, Kube, wait_for
from tests.e2e_k8s.lab import AGENT, NODE_NAME, Lab, LabFailed, free_port

PACKAGED_CONFIG = REPO / "packaging" / "kubernetes" / "kube-scheduler-config.yaml"
PYTHON = REPO / ".venv" / "bin" / "python"
EXTENDER = "nri-numa-extender"
KEEPER = "virtual-nodes"
SCHEDULER = "kube-scheduler"
PRESETS = ("dgx-h100=2", "amd-epyc-2s-nps4", "gb200")
PREFIX = "lab-"
VIRTUAL_NODES = ("lab-dgx-h100-0", "lab-dgx-h100-1", "lab-amd-epyc-2s-nps4-0", "lab-gb200-0")
NRT_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
READY_S = 60.0


class LabCertificates:
    """The lab's TLS files: the extender's certificate (for 127.0.0.1) and kube-scheduler's
    client certificate, each signed by a CA of its own."""

    def __init__(self, folder: Path) -> None:
        self.server_ca = make_ca(folder, "server-ca")
        self.client_ca = make_ca(folder, "client-ca")
        self.server = make_signed(folder, "extender", self.server_ca, server=True)
        self.scheduler = make_signed(folder, "kube-scheduler", self.client_ca, server=False)

    def extender_args(self) -> list[str]:
        return ["--tls-cert", str(self.server.cert), "--tls-key", str(self.server.key),
                "--client-ca", str(self.client_ca.cert)]


def scheduler_config(kubeconfig: Path, extender_port: int, health_port: int,
                     client: KeyPair, server_ca: Path) -> dict[str, Any]:
    """The lab's KubeSchedulerConfiguration: the packaged one's extender, pointed at the
    extender on 127.0.0.1 and the lab's certificate files, with the lab's kube-scheduler
    identity, no leader election, health on 127.0.0.1."""
    packaged = yaml.safe_load(PACKAGED_CONFIG.read_text())
    [extender] = packaged["extenders"]
    health = f"127.0.0.1:{health_port}"  # with --config, --port no longer applies
    tls = {**extender["tlsConfig"], "certFile": str(client.cert), "keyFile": str(client.key),
           "caFile": str(server_ca)}
    return {"apiVersion": packaged["apiVersion"], "kind": packaged["kind"],
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "leaderElection": {"leaderElect": False},
            "healthzBindAddress": health, "metricsBindAddress": health,
            "extenders": [{**extender, "tlsConfig": tls,
                           "urlPrefix": f"https://127.0.0.1:{extender_port}/nri-numa"}]}


def _answers(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0, context=context) as answer:  # noqa: S310
            return answer.status == 200
    except OSError:
        return False


class ExtenderLab:
    def __init__(self, lab: Lab, kube: Kube) -> None:
        self.lab, self.kube = lab, kube
        self.extender_port = free_port()
        self.health_port = free_port()
        self.config_file = lab.folder / "kube-scheduler-extender.yaml"
        self._plain_scheduler: list[str] = []
        self.certificates: LabCertificates | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.extender_port}"

    def client_context(self, client: KeyPair | None) -> ssl.SSLContext:
        """A client's TLS context that trusts the extender; with ``client``'s certificate."""
        context = ssl.create_default_context(cafile=str(self.certificates.server_ca.cert))
        if client is not None:
            context.load_cert_chain(str(client.cert), str(client.key))
        return context

    def start_extender(self) -> None:
        self.lab._start(EXTENDER, [str(AGENT), "scheduler-extender", "--listen",
                                   f"127.0.0.1:{self.extender_port}", "--kubeconfig",
                                   str(self.lab.kubeconfig), *self.certificates.extender_args()])
        scheduler = self.client_context(self.certificates.scheduler)
        self._wait(lambda: _answers(f"{self.url}/healthz", scheduler),
                   "the extender to serve", EXTENDER)

    def up(self) -> None:
        lab = self.lab
        lab._start(KEEPER, [str(PYTHON), "-m", "nri_numa.cluster.virtual_nodes", "--kubeconfig",
                            str(lab.kubeconfig), "--prefix", PREFIX, *PRESETS])
        self._wait(lambda: all(self.kube.node_schedulable(n) for n in VIRTUAL_NODES),
                   "the virtual nodes Ready and without the not-ready taint", KEEPER)
        self._wait(lambda: set(VIRTUAL_NODES) | {NODE_NAME} <= self.published(),
                   "every node's NodeResourceTopology with its node state", KEEPER)
        self.certificates = LabCertificates(lab.folder / "tls")
        self.start_extender()
        self.config_file.write_text(json.dumps(scheduler_config(
            lab.component_kubeconfig(SCHEDULER), self.extender_port, self.health_port,
            self.certificates.scheduler, self.certificates.server_ca.cert), indent=1) + "\n")
        self._plain_scheduler = lab._argv[SCHEDULER]
        self._replace_scheduler([self._plain_scheduler[0], f"--config={self.config_file}",
                                 "--secure-port=0"])

    def down(self) -> list[str]:
        """Back to the plain lab; what could not be undone."""
        problems: list[str] = []
        if self._plain_scheduler:
            problems += self._replace_scheduler(self._plain_scheduler)
        for name in (EXTENDER, KEEPER):  # the keeper removes its nodes as it stops
            if name in self.lab.recorded.pids:
                problems += self.lab._stop(name)
                del self.lab.recorded.pids[name]
                self.lab._children.pop(name, None)
        self.lab._save()
        left = [n for n in VIRTUAL_NODES if self.kube.node(n) is not None]
        return problems + [f"virtual node {n} left behind" for n in left]

    def published(self) -> set[str]:
        """The nodes whose NodeResourceTopology carries the node state."""
        from nri_numa.cluster.node_state import ANNOTATION

        try:
            items = self.kube.get(NRT_PATH)["items"]
        except ApiError:
            return set()
        return {o["metadata"]["name"] for o in items
                if ANNOTATION in (o["metadata"].get("annotations") or {})}

    def _replace_scheduler(self, argv: list[str]) -> list[str]:
        problems = self.lab._stop(SCHEDULER)
        self.lab._start(SCHEDULER, argv)
        if any(a.startswith("--config=") for a in argv):
            self._wait(lambda: _answers(f"http://127.0.0.1:{self.health_port}/healthz"),
                       "kube-scheduler with the extender to serve its health", SCHEDULER)
        return problems

    def _wait(self, condition: Any, what: str, log_name: str) -> None:
        try:
            wait_for(condition, READY_S, what, poll_s=0.2)
        except TimeoutError as e:
            raise LabFailed(f"{e}\n{self.lab.log_tail(log_name)}") from None
