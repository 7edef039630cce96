"""The scheduler extender as users deploy it: packaging/kubernetes/scheduler-extender.yaml applied
(its ServiceAccount and RBAC, Deployment, Service), with its TLS Secret made as
docs/scheduler-extender.md says, and the lab's kube-scheduler started with the packaged
KubeSchedulerConfiguration (tests/e2e_k8s/extender_lab.py: its URL, and the lab's kubeconfig and
certificate files). The extender tier's core checks (tests/e2e_k8s/test_scheduler_extender.py)
pass through it, and a restart of the Deployment loses nothing: its pod names its node, so
kube-scheduler, which would ask the extender being replaced, never has to place it.

The overlay sets what a user sets (the node the extender runs on, the lab's only real node) and
changes what the lab cannot have as a cluster has it: the lab's kube-scheduler runs on the host
and reaches no pod network (the CNI bridge has no host address), and the API server listens on
127.0.0.1 only: the extender's pod shares the host's network, listens on 127.0.0.1 at a free
port, and is told the API server's address."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e_k8s.daemonset import PACKAGE
from tests.e2e_k8s.extender_lab import ExtenderLab, _answers
from tests.e2e_k8s.kube import Json, Kube, wait_for
from tests.e2e_k8s.lab import NODE_NAME, Lab, LabFailed
from tests.e2e_k8s.pods import SUMMARY
from tests.e2e_k8s.test_scheduler_extender import (  # noqa: F401 (run here, through the Deployment)
    assert_no_virtual_node_over_committed, pod,
    test_a_pod_that_fits_nowhere_stays_pending_with_each_nodes_reason,
    test_pods_land_where_the_engine_admits_them_on_the_numa_nodes_it_chose, wait_decided)
from tests.e2e_k8s.scheduling import unschedulable

pytestmark = pytest.mark.k8s
NAME = "nri-numa-scheduler-extender"
NAMESPACE = "kube-system"
READY_S = 120.0


class DeployedExtender(ExtenderLab):
    """ExtenderLab with the extender in its Deployment's pod instead of a host process."""

    def start_extender(self) -> None:
        tls = self.certificates  # made by ExtenderLab.up
        # The Secret, as docs/scheduler-extender.md ("Certificates") makes it.
        self.kube.kubectl("-n", NAMESPACE, "create", "secret", "generic", f"{NAME}-tls",
                          f"--from-file=tls.crt={tls.server.cert}", f"--from-file=tls.key={tls.server.key}",
                          f"--from-file=client-ca.crt={tls.client_ca.cert}")
        self.kube.kubectl("apply", "-k", str(self._overlay()))
        scheduler = self.client_context(tls.scheduler)
        try:
            wait_for(lambda: _answers(f"{self.url}/healthz", scheduler), READY_S,
                     "the extender's pod to serve", poll_s=0.5)
        except TimeoutError as e:
            pods = self.kube.kubectl("-n", NAMESPACE, "describe", "pods", "-l",
                                     f"app.kubernetes.io/name={NAME}")
            raise LabFailed(f"{e}\n{pods}") from None

    def down(self) -> list[str]:
        """The plain lab's kube-scheduler back, the virtual nodes gone, the extender's objects
        deleted (its pod would hold 500m of the real node's CPUs)."""
        problems = super().down()
        self.kube.kubectl("delete", "-k", str(self.lab.folder / "extender-overlay"), "--wait=true",
                          timeout_s=120)
        self.kube.kubectl("-n", NAMESPACE, "delete", "secret", f"{NAME}-tls")
        return problems

    def _overlay(self) -> Path:
        folder = self.lab.folder / "extender-overlay"
        folder.mkdir(exist_ok=True)
        # kubectl 1.20's kustomize takes resources inside its folder only: the packaged file, as is.
        shutil.copy(PACKAGE / "scheduler-extender.yaml", folder)
        port = str(self.extender_port)
        (folder / "lab.yaml").write_text(yaml.safe_dump({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {"template": {"spec": {"nodeName": NODE_NAME, "hostNetwork": True, "containers": [{
                "name": "extender", "env": [
                    {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                    {"name": "KUBERNETES_SERVICE_PORT",
                     "value": str(self.lab.recorded.ports["apiserver"])}]}]}}}}))
        (folder / "lab-port.yaml").write_text(yaml.safe_dump([
            {"op": "replace", "path": "/spec/template/spec/containers/0/args/2",
             "value": f"127.0.0.1:{port}"},
            {"op": "replace", "path": "/spec/template/spec/containers/0/ports/0/containerPort",
             "value": int(port)}]))
        (folder / "kustomization.yaml").write_text(yaml.safe_dump({
            "resources": ["scheduler-extender.yaml"], "patchesStrategicMerge": ["lab.yaml"],
            "patchesJson6902": [{"target": {"group": "apps", "version": "v1", "kind": "Deployment",
                                            "name": NAME, "namespace": NAMESPACE},
                                 "path": "lab-port.yaml"}]}))
        return folder


@pytest.fixture(scope="module")
def extender_lab(lab: Lab, kube: Kube) -> Iterator[ExtenderLab]:
    made = DeployedExtender(lab, kube)
    began = time.monotonic()
    try:
        made.up()
        SUMMARY.append(f"scheduler extender Deployment + virtual nodes up in "
                       f"{time.monotonic() - began:.1f} s")
        yield made
    finally:
        problems = made.down()
        assert not problems, f"putting the plain lab back left: {problems}"


def extender_pod(kube: Kube) -> Json | None:
    """The Deployment's running pod; None while there is none. (Running, not Ready: on the lab
    it listens on 127.0.0.1, where the kubelet's TCP probe of the node's address finds nothing;
    whether it serves is asked of it directly.)"""
    for obj in kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector="
                        f"app.kubernetes.io%2Fname%3D{NAME}")["items"]:
        if not obj["metadata"].get("deletionTimestamp") and obj["status"].get("phase") == "Running":
            return obj
    return None


def test_a_restart_of_the_deployment_places_its_pod_and_over_commits_no_node(
        extender_lab: ExtenderLab, kube: Kube) -> None:
    # 100 exclusive CPUs fit one NUMA node of a dgx-h100 only, and the two have four: of six
    # such pods, two bound before the restart and four asked after it, four fit. A new extender
    # that lost the first two would bind more.
    before = [pod(f"before-{i}", cpu="100", memory="1Gi") for i in range(2)]
    kube.apply(before)
    assert all(p["spec"].get("nodeName") for p in wait_decided(kube, names(before)).values())
    old = extender_pod(kube)
    assert old is not None
    began = time.monotonic()
    kube.kubectl("-n", NAMESPACE, "rollout", "restart", f"deployment/{NAME}")
    new = wait_for(lambda: (p := extender_pod(kube)) and p["metadata"]["uid"] != old["metadata"]["uid"]
                   and p, READY_S, "the restarted extender's pod to run", poll_s=0.5)
    scheduler = extender_lab.client_context(extender_lab.certificates.scheduler)
    wait_for(lambda: _answers(f"{extender_lab.url}/healthz", scheduler), READY_S,
             "the restarted extender to serve", poll_s=0.5)
    took = time.monotonic() - began
    assert new["spec"]["nodeName"] == NODE_NAME
    after = [pod(f"after-{i}", cpu="100", memory="1Gi") for i in range(4)]
    kube.apply(after)
    pods = wait_decided(kube, names(before + after))
    bound = [p for p in pods.values() if p["spec"].get("nodeName")]
    assert_no_virtual_node_over_committed(kube, bound)
    assert len(bound) == 4, {n: unschedulable(p) for n, p in pods.items()}
    pending = [unschedulable(p) for p in pods.values() if not p["spec"].get("nodeName")]
    assert all("nri-numa:" in message for message in pending), pending
    SUMMARY.append(f"scheduler extender Deployment restarted in {took:.1f} s; of 6 pods of 100 "
                   f"CPUs, 2 bound before and {len(bound) - 2} after, {len(pending)} pending")
    print(SUMMARY[-1])


def names(manifests: list[Json]) -> list[str]:
    return [m["metadata"]["name"] for m in manifests]
