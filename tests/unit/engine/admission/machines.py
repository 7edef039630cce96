"""Builders for the admission tests: machines, configurations, pods and pre-filled snapshots.

The kubelet's CPU Manager tests describe machines as CPU tables (tests/unit/engine/cpu/
kubelet_fixtures.py transcribes them); ``machine_from_cpus`` turns such a table into the
``Topology`` the engine is built from, one NUMA node per node id the table names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nri_numa.engine.admit import Admission, admit
from nri_numa.engine.allocations import Allocations, ContainerAllocation, PodAllocation
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.cpu import CPUTopology, cpu_topology
from nri_numa.engine.manifest import container_from_resources, pod_from_manifest
from nri_numa.engine.request import ContainerKind, ContainerRequest, PodRequest
from nri_numa.topology.cpulist import parse_list
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, HugePages, NumaNode

GIB = 1 << 30


def cpus(text: str) -> frozenset[int]:
    """Kernel list syntax, as the upstream tests write CPU sets ("0-3,8")."""
    return parse_list(text)


def machine_from_cpus(layout: CPUTopology, *, memory_bytes: int = 64 * GIB,
                      hugepages: Mapping[int, int] | None = None) -> Topology:
    """A machine with ``layout``'s CPUs; each NUMA node gets ``memory_bytes`` and, per page size
    in KiB, ``hugepages`` free pages; every other node is at distance 21."""
    node_ids = sorted({c.numa for c in layout.cpus})
    machine_cpus = tuple(Cpu(id=c.cpu, numa=c.numa, core=c.core, socket=c.socket, l3=c.uncore)
                         for c in layout.cpus)
    pages = {size: HugePages(total=count, free=count) for size, count in (hugepages or {}).items()}
    nodes = tuple(NumaNode(id=n, cpus=frozenset(c.cpu for c in layout.cpus if c.numa == n),
                           memory_bytes=memory_bytes, hugepages=pages,
                           distances={m: 10 if m == n else 21 for m in node_ids})
                  for n in node_ids)
    return Topology(cpus=machine_cpus, numa_nodes=nodes)


def with_reserved_twin(layout: CPUTopology) -> tuple[CPUTopology, frozenset[int]]:
    """``layout`` plus a copy of its first socket on new CPU, core, socket and NUMA ids, and
    the copy's CPUs to reserve.

    The kubelet's static-policy tests often build the policy with no reserved CPUs, which a
    configuration cannot do (static needs a reservation). Reserving a whole twin socket keeps
    every CPU of the original layout available and leaves the kubelet's per-unit sizes
    (CPUs per core, per socket) unchanged, so the original expectations still hold.
    """
    first = min(c.socket for c in layout.cpus)
    copied = sorted((c for c in layout.cpus if c.socket == first), key=lambda c: c.cpu)
    cpu_base = max(c.cpu for c in layout.cpus) + 1
    core_base = max(c.core for c in layout.cpus) + 1
    socket = max(c.socket for c in layout.cpus) + 1
    numa_base = max(c.numa for c in layout.cpus) + 1
    records = [{"cpu": c.cpu, "core": c.core, "socket": c.socket, "numa": c.numa,
                "uncore_cache": c.uncore} for c in layout.cpus]
    twin = [{"cpu": cpu_base + i, "core": core_base + c.core, "socket": socket,
             "numa": numa_base + c.numa, "uncore_cache": None} for i, c in enumerate(copied)]
    return cpu_topology(records + twin), frozenset(r["cpu"] for r in twin)


def context(topology: Topology, **config: Any) -> EngineContext:
    """An engine for ``topology`` configured with KubeletConfiguration keys."""
    return EngineContext.build(topology, config_from_mapping(config))


def static_cpu(reserved: str, policy: str = "none", **more: Any) -> dict[str, Any]:
    """Config keys for the static CPU Manager with ``reservedSystemCPUs``."""
    return {"cpuManagerPolicy": "static", "reservedSystemCPUs": reserved,
            "topologyManagerPolicy": policy, **more}


def container(name: str, cpu: str | None = None, memory: str | None = "1Gi", *,
              kind: ContainerKind = ContainerKind.APP, request_cpu: str | None = None,
              devices: Mapping[str, int] | None = None,
              hugepages: Mapping[str, str] | None = None,
              device_numa_hints: Mapping[str, Iterable[int]] | None = None) -> ContainerRequest:
    """A container whose limits are ``cpu``/``memory`` (so requests equal them, Guaranteed)
    unless ``request_cpu`` asks for less."""
    limits: dict[str, Any] = {}
    if cpu is not None:
        limits["cpu"] = cpu
    if memory is not None:
        limits["memory"] = memory
    limits.update(hugepages or {})
    limits.update({k: str(v) for k, v in (devices or {}).items()})
    requests = {"cpu": request_cpu} if request_cpu is not None else {}
    return container_from_resources(name, kind, requests, limits,
                                    device_numa_hints=device_numa_hints)


def pod(uid: str, *apps: ContainerRequest, inits: Iterable[ContainerRequest] = (),
        annotations: Mapping[str, str] | None = None) -> PodRequest:
    return PodRequest(uid=uid, namespace="default", name=uid.rsplit("/", 1)[-1],
                      init_containers=tuple(inits), app_containers=apps,
                      annotations=dict(annotations or {}))


def guaranteed_pod(uid: str, cpu: str, memory: str = "1Gi", name: str = "main",
                   **extra: Any) -> PodRequest:
    """One app container with equal requests and limits."""
    return pod(uid, container(name, cpu, memory, **extra))


def manifest_pod(name: str, limits: Mapping[str, Any],
                 annotations: Mapping[str, str] | None = None) -> PodRequest:
    """A pod from a Kubernetes manifest, the way the front doors build one."""
    return pod_from_manifest({"metadata": {"name": name, "annotations": dict(annotations or {})},
                              "spec": {"containers": [{"name": "main",
                                                       "resources": {"limits": dict(limits)}}]}})


def with_assignments(ctx: EngineContext, shared: Iterable[int],
                     assignments: Mapping[str, Mapping[str, Iterable[int]]]) -> Allocations:
    """A snapshot where ``assignments`` (pod → container → exclusive CPUs) are already placed
    and the shared pool is ``shared``, as the kubelet tests pre-fill their state."""
    pods = {pod_id: PodAllocation(containers={
        name: ContainerAllocation(exclusive_cpus=frozenset(held)) for name, held in names.items()})
        for pod_id, names in assignments.items()}
    return Allocations(shared=frozenset(shared), pods=pods,
                       memory=ctx.empty_allocations().memory)


def admitted(ctx: EngineContext, allocs: Allocations, request: PodRequest,
             containers: Iterable[str] | None = None) -> Admission:
    """``admit`` that must admit; the failure message carries the refusal."""
    result = admit(ctx, allocs, request, containers)
    assert result.decision.admitted, result.decision.rejection
    return result
