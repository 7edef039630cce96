"""Where the kubelet's CPU and Memory Manager checkpoints and nri-numa's ledger disagree
(``nri-numa state --kubelet-state-dir``; docs/migrating-from-kubelet.md)."""

from __future__ import annotations

from nri_numa.state.kubelet_checkpoints import KubeletCpuState, KubeletMemoryState, KubeletPlacements
from nri_numa.topology.cpulist import format_list
from nri_numa.views.state_view import ContainerView, StateView


def disagreements(view: StateView, kubelet: KubeletPlacements) -> list[str]:
    """One line per container whose exclusive CPUs, or whose Memory Manager nodes, differ
    between the two, named as the pod's namespace/name and the container's name (the kubelet's
    v1 CPU layout names containers by id); then the kubelet's entries nri-numa does not know."""
    lines = []
    if kubelet.cpu is not None:
        lines += _cpu_disagreements(view, kubelet.cpu)
    if kubelet.memory is not None:
        lines += _memory_disagreements(view, kubelet.memory)
    return lines


def _cpu_disagreements(view: StateView, kubelet: KubeletCpuState) -> list[str]:
    theirs = dict(kubelet.assignments)
    lines = []
    for container in view.containers:
        key = _cpu_key(container, kubelet)
        given = theirs.pop(key, None) if key is not None else None
        ours = container.cpus if container.exclusive else None
        if given != ours:
            lines.append(f"{_name(container)}: the kubelet's CPUs {_cpus(given)}, "
                         f"nri-numa's {_cpus(ours)}")
    for (uid, name), cpus in sorted(theirs.items()):
        who = f"pod {uid} container {name}" if uid else f"container {name}"
        lines.append(f"{who}: the kubelet's CPUs {format_list(cpus)}, unknown to nri-numa")
    return lines


def _memory_disagreements(view: StateView, kubelet: KubeletMemoryState) -> list[str]:
    theirs = {key: frozenset().union(*(b.numa_nodes for b in blocks))
              for key, blocks in kubelet.assignments.items()}
    lines = []
    for container in view.containers:
        given = (theirs.pop((container.pod.uid, container.name), None)
                 if container.pod is not None else None)
        ours = frozenset(n for held in container.memory for n in held.nodes) or None
        if given != ours:
            lines.append(f"{_name(container)}: the kubelet's memory on NUMA nodes "
                         f"{_nodes(given)}, nri-numa's {_nodes(ours)}")
    for (uid, name), nodes in sorted(theirs.items()):
        lines.append(f"pod {uid} container {name}: the kubelet's memory on NUMA nodes "
                     f"{format_list(nodes)}, unknown to nri-numa")
    return lines


def _cpu_key(container: ContainerView, kubelet: KubeletCpuState) -> tuple[str, str] | None:
    if kubelet.format == "v1":
        return ("", container.id)
    return (container.pod.uid, container.name) if container.pod is not None else None


def _name(container: ContainerView) -> str:
    pod = f"{container.pod.namespace}/{container.pod.name}" if container.pod else "?"
    return f"pod {pod} container {container.name}"


def _cpus(cpus: frozenset[int] | None) -> str:
    return format_list(cpus) if cpus else "none (shared pool)"


def _nodes(nodes: frozenset[int] | None) -> str:
    return format_list(nodes) if nodes else "none (not placed by a Memory Manager)"
