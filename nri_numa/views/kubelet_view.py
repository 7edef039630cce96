"""Where the kubelet's CPU Manager checkpoint and nri-numa's ledger disagree
(``nri-numa state --kubelet-state-dir``; docs/migrating-from-kubelet.md)."""

from __future__ import annotations

from nri_numa.state.kubelet_checkpoints import KubeletCpuState
from nri_numa.topology.cpulist import format_list
from nri_numa.views.state_view import ContainerView, StateView


def disagreements(view: StateView, kubelet: KubeletCpuState) -> list[str]:
    """One line per container whose exclusive CPUs differ between the two, named as the pod's
    namespace/name and the container's name (the kubelet's v1 layout names containers by id)."""
    theirs = dict(kubelet.assignments)
    lines = []
    for container in view.containers:
        key = _key(container, kubelet)
        given = theirs.pop(key, None) if key is not None else None
        ours = container.cpus if container.exclusive else None
        if given != ours:
            lines.append(f"{_name(container)}: the kubelet's CPUs {_cpus(given)}, "
                         f"nri-numa's {_cpus(ours)}")
    for (uid, name), cpus in sorted(theirs.items()):
        who = f"pod {uid} container {name}" if uid else f"container {name}"
        lines.append(f"{who}: the kubelet's CPUs {format_list(cpus)}, unknown to nri-numa")
    return lines


def _key(container: ContainerView, kubelet: KubeletCpuState) -> tuple[str, str] | None:
    if kubelet.format == "v1":
        return ("", container.id)
    return (container.pod.uid, container.name) if container.pod is not None else None


def _name(container: ContainerView) -> str:
    pod = f"{container.pod.namespace}/{container.pod.name}" if container.pod else "?"
    return f"pod {pod} container {container.name}"


def _cpus(cpus: frozenset[int] | None) -> str:
    return format_list(cpus) if cpus else "none (shared pool)"
