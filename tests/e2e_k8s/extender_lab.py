"""The lab's kube-scheduler with nri-numa's scheduler extender, over the lab's real node and a few
virtual nodes (tests/e2e_k8s/test_scheduler_extender.py, and `scripts/k8s-lab up DIR
--scheduler-extender`; docs/scheduler-extender.md has this as its worked example).

`ExtenderLab(lab).up()` starts, as processes of the lab (logs in ``<folder>/logs``):

- ``virtual-nodes``: ``python -m nri_numa.cluster.virtual_nodes`` keeping `VIRTUAL_NODES`
  Ready and publishing their node state (no kubelet: pods bound there never run);
- ``nri-numa-extender``: ``nri-numa scheduler-extender`` on a free 127.0.0.1 port;
- kube-scheduler again, with ``--config`` naming a KubeSchedulerConfiguration whose
  ``extenders`` entry is packaging/kubernetes/kube-scheduler-config.yaml's, pointed at that port.

`down()` puts the lab's own kube-scheduler back and stops the other two (the keeper deletes its
nodes and the pods bound to them), so the lab's other tests see the lab they always saw.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from nri_numa.cluster.nrt import GROUP, PLURAL, VERSION
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


def scheduler_config(kubeconfig: Path, extender_port: int, health_port: int) -> dict[str, Any]:
    """The lab's KubeSchedulerConfiguration: the packaged one's extender, pointed at the
    extender on 127.0.0.1, with the lab's client, no leader election, health on 127.0.0.1."""
    packaged = yaml.safe_load(PACKAGED_CONFIG.read_text())
    [extender] = packaged["extenders"]
    health = f"127.0.0.1:{health_port}"  # with --config, --port no longer applies
    return {"apiVersion": packaged["apiVersion"], "kind": packaged["kind"],
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "leaderElection": {"leaderElect": False},
            "healthzBindAddress": health, "metricsBindAddress": health,
            "extenders": [{**extender,
                           "urlPrefix": f"http://127.0.0.1:{extender_port}/nri-numa"}]}


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as answer:  # noqa: S310 (127.0.0.1)
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

    def up(self) -> None:
        lab = self.lab
        lab._start(KEEPER, [str(PYTHON), "-m", "nri_numa.cluster.virtual_nodes", "--kubeconfig",
                            str(lab.kubeconfig), "--prefix", PREFIX, *PRESETS])
        self._wait(lambda: all(self.kube.node_schedulable(n) for n in VIRTUAL_NODES),
                   "the virtual nodes Ready and without the not-ready taint", KEEPER)
        self._wait(lambda: set(VIRTUAL_NODES) | {NODE_NAME} <= self.published(),
                   "every node's NodeResourceTopology with its node state", KEEPER)
        lab._start(EXTENDER, [str(AGENT), "scheduler-extender", "--listen",
                              f"127.0.0.1:{self.extender_port}", "--kubeconfig",
                              str(lab.kubeconfig)])
        self._wait(lambda: _answers(f"http://127.0.0.1:{self.extender_port}/healthz"),
                   "the extender to serve", EXTENDER)
        self.config_file.write_text(json.dumps(scheduler_config(
            lab.kubeconfig, self.extender_port, self.health_port), indent=1) + "\n")
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
