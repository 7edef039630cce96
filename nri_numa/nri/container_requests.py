"""A runtime's container → its pod's record and the engine's request for it.

The request carries the NUMA nodes of the devices the container already has (its device nodes,
``NVIDIA_VISIBLE_DEVICES``, CDI names: DeviceLocator) and of those the kubelet gave it
(PodResources); the kubelet's word wins, as it chose them. The pod's request is the pod as far
as the plugin knows it: its managed containers in creation order, then this one; with the NUMA
nodes the scheduler extender chose for it, when its annotation names some of this machine's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from nri_numa.engine.annotations import AnnotationError
from nri_numa.engine.context import EngineContext
from nri_numa.engine.devices import Resource
from nri_numa.engine.request import ContainerRequest, PodRequest
from nri_numa.nri import decision_log
from nri_numa.nri.decision_log import describe
from nri_numa.nri.records import Records
from nri_numa.nri.session import PluginError
from nri_numa.runtime import (DeviceLocator, RuntimeContainer, container_request, pod_identity,
                              pod_qos, pod_request, requested_devices)
from nri_numa.runtime import with_scheduled_numa as scheduled_numa
from nri_numa.state.plugin_records import PodRecord

# (namespace, pod, container) → the kubelet's devices' NUMA nodes (PodResources API).
KubeletHints = Callable[[str, str, str], dict[str, frozenset[int]]]


class RequestReader:
    def __init__(self, locator: DeviceLocator, kubelet_hints: KubeletHints) -> None:
        self._locator = locator
        self._kubelet_hints = kubelet_hints

    def read(self, container: RuntimeContainer, records: Records
             ) -> tuple[PodRecord, ContainerRequest]:
        """The container's pod (now recorded) and request; an older container of the same
        name in that pod is forgotten, as it has exited."""
        uid, namespace, name = pod_identity(container.pod)
        pod = records.pod(PodRecord(container.pod.id, uid, namespace, name,
                                    container.pod.cgroup_parent, container.pod.annotations))
        request = container_request(container, pod_qos(container.pod), {
            **self._locator.numa_hints(container),
            **self._kubelet_hints(namespace, name, container.name)})
        records.forget_stale(pod, request.name, container.id)
        return pod, request

    def held_devices(self, container: RuntimeContainer,
                     resources: Mapping[str, Resource]) -> dict[str, frozenset[str]]:
        """The container's devices that are devices of ``resources``, by resource."""
        return self._locator.held_devices(container, resources)


def pod_as_known(records: Records, container: RuntimeContainer,
                 request: ContainerRequest) -> PodRequest:
    """The container's pod as far as it is known: its managed containers, then ``request``."""
    known = records.known_requests(container.pod.id, request.name)
    return pod_request(container.pod, [*known, request])


def with_requested_devices(ctx: EngineContext, container: RuntimeContainer, pod: PodRecord,
                           request: ContainerRequest) -> ContainerRequest:
    """The request plus the devices of the container's own ``numa.nri.io/devices`` (the pod's
    ``numa.nri.io/devices.<container>`` is the engine's, docs/devices.md)."""
    try:
        devices = requested_devices(container, ctx.devices, ctx.device_classes)
    except AnnotationError as e:
        decision_log.refused(pod, request.name, container.id, None, "InvalidAnnotation", None,
                             f"InvalidAnnotation: {e}")
        raise PluginError(f"nri-numa: InvalidAnnotation: {describe(pod, request.name)}: "
                          f"{e}") from None
    return replace(request, devices=devices) if devices else request


def with_scheduled_numa(ctx: EngineContext, pod: PodRecord, container: str,
                        request: PodRequest) -> PodRequest:
    """The pod with the NUMA nodes the scheduler chose as ``preferred_numa``; a value that
    cannot be read is one warning line and no preference."""
    request, problem = scheduled_numa(request, (n.id for n in ctx.topology.numa_nodes))
    if problem is not None:
        decision_log.log.warning("%s: %s", describe(pod, container), problem)
    return request
