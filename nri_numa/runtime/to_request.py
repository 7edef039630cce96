"""Runtime containers → the engine's requests, for every front door.

What a runtime knows is what the kubelet wrote into the container's Linux resources, not the
pod spec, so each request is read back from it (docs/nri-plugin.md, "What the kubelet sends"):

* **QoS** comes from the pod's cgroup parent, which the kubelet names after the class
  (``/kubepods/burstable/pod<uid>``, ``kubepods-besteffort-pod<uid>.slice``, ...). A runtime
  sees a pod's containers one at a time, so the class cannot be computed from the containers
  it has seen so far. Outside Kubernetes (no kubepods parent) the engine computes it from the
  resources, with the API server's defaulting: a limit alone is also the request.
* **CPU request** from ``cpu.shares``: the kubelet writes ``max(2, millicores*1024/1000)``
  (integer division); each share count comes from at most one millicore value, which
  ``ceil(shares*1000/1024)`` recovers exactly. Shares of 2 or less mean no request.
* **CPU limit** from quota/period, **memory limit** as is; hugepage limits are also the
  requests (hugepages cannot be overcommitted). Kubernetes does not pass the memory request to
  the runtime; only Guaranteed pods (request = limit) need it, for the Memory Manager.
* **Devices** the container already has become NUMA hints (``device_locator``), so CPUs and
  memory follow them; devices it asks for by annotation become its device request
  (docs/devices.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from nri_numa.engine.annotations import (DEVICES, ISOLATED_CPUS, SCHEDULED_NUMA_NODES,
                                         AnnotationError, scheduled_numa_nodes)
from nri_numa.engine.decision import PreferredNuma
from nri_numa.engine.devices import Resource
from nri_numa.engine.devices.requested import (container_devices, pod_devices_for,
                                               resolve_devices)
from nri_numa.engine.request import ContainerRequest, PodRequest, QosClass
from nri_numa.runtime.container import RuntimeContainer, RuntimePod
from nri_numa.topology.cpulist import format_list

MIN_SHARES = 2  # the kubelet's floor: what a container without a CPU request gets
DEFAULT_NAMESPACE = "default"

_POD_UID_LABEL = "io.kubernetes.pod.uid"
_POD_NAME_LABEL = "io.kubernetes.pod.name"
_POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"

_QOS_BY_WORD = {"": QosClass.GUARANTEED, "burstable": QosClass.BURSTABLE,
                "besteffort": QosClass.BEST_EFFORT}
# systemd driver: kubepods-pod<uid>.slice, kubepods-burstable-pod<uid>.slice, ... (the uid's
# dashes become underscores in unit names).
_SYSTEMD_POD = re.compile(r"kubepods(?:-(burstable|besteffort))?-pod[0-9A-Za-z_]+\.slice")
_CGROUPFS_POD = re.compile(r"pod[0-9A-Za-z_-]+")


def qos_from_cgroup_parent(parent: str) -> QosClass | None:
    """The QoS class the kubelet encoded in a pod's cgroup parent; None outside Kubernetes.

    cgroupfs: ``[/root]/kubepods[/burstable|/besteffort]/pod<uid>``; systemd: the last unit
    ``kubepods[-burstable|-besteffort]-pod<uid>.slice``, alone or at the end of a slice path.
    """
    parts = [p for p in parent.strip().split("/") if p]
    if not parts:
        return None
    if m := _SYSTEMD_POD.fullmatch(parts[-1]):
        return _QOS_BY_WORD[m[1] or ""]
    if not _CGROUPFS_POD.fullmatch(parts[-1]) or len(parts) < 2:
        return None
    if parts[-2] == "kubepods":
        return QosClass.GUARANTEED
    if parts[-2] in ("burstable", "besteffort") and len(parts) >= 3 and parts[-3] == "kubepods":
        return _QOS_BY_WORD[parts[-2]]
    return None


def cpu_request_millicores(shares: int | None) -> int:
    """The CPU request the kubelet turned into ``shares``; 0 for none (unset, or the floor)."""
    if shares is None or shares <= MIN_SHARES:
        return 0
    return -(-shares * 1000 // 1024)


def cpu_limit_millicores(quota: int | None, period: int | None) -> int:
    """The CPU limit behind a CFS quota; 0 for no limit (unset or negative quota)."""
    if quota is None or quota <= 0 or not period or period <= 0:
        return 0
    return -(-quota * 1000 // period)


def _positive(value: int | None) -> int:
    return value if value is not None and value > 0 else 0


# --- devices -------------------------------------------------------------------------------


# --- devices asked for by annotation ------------------------------------------------------


def requested_devices(container: RuntimeContainer, resources: Mapping[str, Resource],
                      classes: Mapping[str, tuple[str, ...]]) -> dict[str, int]:
    """What the container's own ``numa.nri.io/devices`` asks for, in the machine's resource
    names. The pod's ``numa.nri.io/devices.<container>`` is applied by the engine itself (it
    travels with the pod's annotations). AnnotationError names a bad value."""
    return resolve_devices(container_devices(container.annotations), resources, classes,
                           DEVICES)


def asked_devices(container: RuntimeContainer) -> dict[str, int]:
    """Every device the container asks for by annotation, its own and its pod's, names as
    written: for a front door that cannot give devices and must refuse. AnnotationError names
    a bad value."""
    return {**pod_devices_for(container.pod.annotations, container.name),
            **container_devices(container.annotations)}


# --- requests ------------------------------------------------------------------------------


def pod_qos(pod: RuntimePod) -> QosClass | None:
    """The pod's class when the kubelet made its cgroup parent; None to compute it."""
    return qos_from_cgroup_parent(pod.cgroup_parent)


def container_request(container: RuntimeContainer, qos: QosClass | None,
                      device_hints: Mapping[str, frozenset[int]] | None = None,
                      ) -> ContainerRequest:
    """The engine's view of one container (always an app container: runtimes do not say which
    containers are init containers; see docs/nri-plugin.md). The devices it asks for by
    annotation are added by the caller (``requested_devices``)."""
    cpu_limit = cpu_limit_millicores(container.cpu_quota, container.cpu_period)
    memory_limit = _positive(container.memory_limit)
    if qos is None:
        # Outside Kubernetes nobody encoded a request: a limit alone is the request too.
        cpu_request = (cpu_request_millicores(container.cpu_shares)
                       if container.cpu_shares is not None else cpu_limit)
        memory_request = memory_limit
    else:
        cpu_request = cpu_request_millicores(container.cpu_shares)
        memory_request = memory_limit if qos is QosClass.GUARANTEED else 0
    if cpu_limit:
        # A quota rounded up by the kubelet's 1 ms floor can sit just under the shares' value.
        cpu_request = min(cpu_request, cpu_limit)
    pages = dict(container.hugepage_limits)
    return ContainerRequest(
        name=container.name, cpu_request=cpu_request, cpu_limit=cpu_limit,
        memory_request=memory_request, memory_limit=memory_limit,
        hugepages_requests=pages, hugepages_limits=pages,
        device_numa_hints=dict(device_hints or {}),
        isolated_cpus=container.annotations.get(ISOLATED_CPUS))


def pod_identity(pod: RuntimePod) -> tuple[str, str, str]:
    """(uid, namespace, name): the sandbox's own fields, else the kubelet's labels, else the
    sandbox id (a pod outside Kubernetes is known by it)."""
    uid = pod.uid or pod.labels.get(_POD_UID_LABEL, "") or pod.id
    name = pod.name or pod.labels.get(_POD_NAME_LABEL, "") or pod.id
    namespace = pod.namespace or pod.labels.get(_POD_NAMESPACE_LABEL, "") or DEFAULT_NAMESPACE
    return uid, namespace, name


def pod_request(pod: RuntimePod, containers: Sequence[ContainerRequest]) -> PodRequest:
    """The pod with the containers known so far, in creation order; its annotations are the
    overrides the engine checks."""
    uid, namespace, name = pod_identity(pod)
    return PodRequest(uid=uid, namespace=namespace, name=name,
                      app_containers=tuple(containers), annotations=pod.annotations,
                      qos_override=pod_qos(pod))


# --- the scheduler's NUMA nodes ----------------------------------------------------------


def with_scheduled_numa(pod: PodRequest, machine_nodes: Iterable[int]
                        ) -> tuple[PodRequest, str | None]:
    """The pod with ``preferred_numa`` from its ``numa.nri.io/scheduled-numa-nodes``, and the
    warning for a value that cannot be read (the pod is then left without a preference: a
    note from the scheduler never stops a pod)."""
    try:
        nodes = scheduled_numa_nodes(pod.annotations, machine_nodes)
    except AnnotationError as e:
        return pod, f"{e}; ignored, the node decides alone"
    return (pod if nodes is None else replace(pod, preferred_numa=nodes)), None


def stale_choice(chosen: PreferredNuma) -> str:
    """The line's words for a scheduler's choice that no longer held, and why."""
    return (f"the scheduler's choice of NUMA node {format_list(chosen.nodes)} "
            f"({SCHEDULED_NUMA_NODES}) is stale, decided anew: {chosen.stale_because}")
