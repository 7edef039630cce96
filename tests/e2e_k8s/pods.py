"""Pods on the lab for the tests: manifests as a person would write them, waiting for them to run
or go, and the CPUs their containers' cgroups really have (read from the host through the
container ids the pod status gives and containerd's cgroup paths, as tests/e2e does)."""

from __future__ import annotations

from collections.abc import Iterable

from nri_numa.topology.cpulist import format_list
from tests.e2e.cri import api_pb2 as cri
from tests.e2e.harness.cgroups import CgroupLayout
from tests.e2e.harness.image import IMAGE_REF
from tests.e2e.nri_agent import cgroup_cpus
from tests.e2e_k8s.kube import Json, Kube, container_statuses, running_container_id, wait_for
from tests.e2e_k8s.lab import Lab

RUN_TIMEOUT_S = 90.0
GONE_TIMEOUT_S = 90.0
TEST_LABEL = "nri-numa-test"
SUMMARY: list[str] = []  # lines the tier prints at the end of the run (conftest.py)


def pod_manifest(name: str, cpu: str | None = None, memory: str | None = None) -> Json:
    """One busybox container sleeping (the image's command), from the image the e2e harness
    imports (imagePullPolicy Never: there is no registry). With ``cpu`` and ``memory``: requests
    = limits, a Guaranteed pod; without: BestEffort."""
    container: Json = {"name": "work", "image": IMAGE_REF, "imagePullPolicy": "Never"}
    if cpu is not None:
        amounts = {"cpu": cpu, "memory": memory or "64Mi"}
        container["resources"] = {"requests": amounts, "limits": dict(amounts)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {TEST_LABEL: "k8s"}},
            # Not 0, which deletes the API object before the kubelet has stopped the pod (see
            # delete_and_wait_gone). The image's stop signal is SIGKILL: stopping never waits.
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 1,
                     "automountServiceAccountToken": False, "enableServiceLinks": False}}


def describe_pods(kube: Kube, names: Iterable[str]) -> str:
    parts = []
    for name in names:
        pod = kube.pod(name)
        if pod is None:
            parts.append(f"{name}: gone")
            continue
        states = [next(iter((s.get("state") or {"?": {}}).items())) for s in container_statuses(pod)]
        parts.append(f"{name}: {pod.get('status', {}).get('phase')} "
                     + ", ".join(f"{state}{' ' + detail.get('reason', '') if detail else ''}"
                                 for state, detail in states))
    return "; ".join(parts)


def wait_running(kube: Kube, names: list[str], timeout_s: float = RUN_TIMEOUT_S) -> dict[str, str]:
    """name → the id of its running container, once all of them run."""
    def ids() -> dict[str, str] | None:
        found = {name: running_container_id(kube.pod(name)) for name in names}
        return found if all(found.values()) else None  # type: ignore[return-value]
    return wait_for(ids, timeout_s, f"pods {', '.join(names)} running", poll_s=0.05,
                    describe=lambda: describe_pods(kube, names))


def pod_uids(kube: Kube, names: Iterable[str]) -> set[str]:
    return {pod["metadata"]["uid"] for pod in (kube.pod(n) for n in names) if pod is not None}


def delete_and_wait_gone(kube: Kube, lab: Lab, names: list[str], timeout_s: float = GONE_TIMEOUT_S) -> None:
    """Deletes the pods as `kubectl delete` does and waits until they are gone: the API objects
    (the kubelet removes them once the pods stopped, 5-15 s later) and, in containerd, every
    container of theirs stopped and no sandbox ready (nri-numa gives CPUs back at StopContainer)."""
    uids = pod_uids(kube, names)
    for name in names:
        kube.delete_pod(name)
    client = lab.cri()
    try:
        def gone() -> bool:
            if any(kube.pod(name) is not None for name in names):
                return False
            live = [c for c in client.list_containers() if c.labels.get("io.kubernetes.pod.uid") in uids
                    and c.state in (cri.CONTAINER_CREATED, cri.CONTAINER_RUNNING)]
            ready = [s for s in client.list_pods() if s.metadata.uid in uids and s.state == cri.SANDBOX_READY]
            return not live and not ready
        wait_for(gone, timeout_s, f"pods {', '.join(names)} stopped after their deletion", poll_s=0.1)
    finally:
        client.close()


def delete_all_test_pods(kube: Kube, lab: Lab) -> None:
    names = [p["metadata"]["name"] for p in kube.pods()
             if p["metadata"].get("labels", {}).get(TEST_LABEL) == "k8s"]
    if names:
        delete_and_wait_gone(kube, lab, names)


def container_cpus(lab: Lab, layout: CgroupLayout, container_id: str) -> frozenset[int]:
    """cpuset.cpus of the container's cgroup (the path from the OCI spec containerd keeps)."""
    client = lab.cri()
    try:
        return cgroup_cpus(client, layout, container_id)
    finally:
        client.close()


def cpus_text(cpus: frozenset[int]) -> str:
    return format_list(cpus) or "(none)"
