"""``nri-numa state`` for people (a table, then the drift spelled out) and for programs (JSON)."""

from __future__ import annotations

import json
from typing import Any

from nri_numa.engine.quantity import format_binary
from nri_numa.topology.cpulist import format_list
from nri_numa.topology.render import align
from nri_numa.views.state_view import ContainerView, MemoryHeld, StateView, age

_HEADER = ("POD", "CONTAINER", "ID", "QOS", "CPUSET", "CPUS", "MEMS", "MEMORY", "DEVICES",
           "CGROUP")
_KINDS = {"nri": "NRI plugin (nri-numa run)", "hook": "OCI hook (nri-numa hook)"}
SHORT_ID = 12  # as crictl and docker shorten container ids


def render_text(view: StateView, now: float | None = None) -> str:
    lines = [f"state: {view.path}, from the {_KINDS[view.kind]}, written {age(view, now):.0f} s "
             "ago",
             f"shared pool: {_cpus(view.shared)}",
             f"reserved CPUs: {_reserved(view)}",
             *([] if view.recorded is None else [f"policies: {_policies(view)}"]),
             f"cgroups: {_tree(view)}"]
    lines += [f"note: {note}" for note in view.notes]
    lines.append("")
    if view.containers:
        lines += align([_HEADER, *(_row(c) for c in view.containers)])
    else:
        lines.append("no containers placed")
    if view.node_memory:
        lines += ["", *align([("NODE", "RESOURCE", "HELD", "ALLOCATABLE"),
                               *((str(m.node), m.resource, format_binary(m.reserved),
                                  format_binary(m.allocatable)) for m in view.node_memory)])]
    lines.append("")
    drifted = view.drifted
    for c in drifted:
        lines.append(f"DRIFT {_pod(c)} {c.name} ({c.id[:SHORT_ID]}) at {c.cgroup.path}: "
                     + "; ".join(c.drift))
    lines.append(f"{len(drifted)} of {len(view.containers)} containers drifted" if drifted
                 else "no drift")
    return "\n".join(lines)


def render_json(view: StateView, now: float | None = None) -> str:
    return json.dumps(view_dict(view, now), indent=2)


def view_dict(view: StateView, now: float | None = None) -> dict[str, Any]:
    return {
        "path": str(view.path),
        "kind": view.kind,
        "age_s": round(age(view, now), 3),
        "shared_pool": format_list(view.shared),
        "reserved_cpus": None if view.reserved is None else format_list(view.reserved),
        "policies": None if view.recorded is None else {
            k: v for k, v in view.recorded.to_dict().items() if k != "reservedCPUs"},
        "cgroups": None if view.cgroups is None else {"version": view.cgroups.version,
                                                      "mount": str(view.cgroups.mount)},
        "containers": [_container_dict(c) for c in view.containers],
        "node_memory": [{"node": m.node, "resource": m.resource, "held": m.reserved,
                         "allocatable": m.allocatable} for m in view.node_memory],
        "notes": list(view.notes),
        "drifted": len(view.drifted),
    }


def _container_dict(c: ContainerView) -> dict[str, Any]:
    return {
        "id": c.id,
        "pod": None if c.pod is None else {"namespace": c.pod.namespace, "name": c.pod.name,
                                           "uid": c.pod.uid, "sandbox_id": c.pod.sandbox_id},
        "name": c.name,
        "qos": None if c.qos is None else c.qos.value,
        "exclusive": c.exclusive,
        "in_ledger": c.in_ledger,
        "cpus": format_list(c.cpus),
        "mems": None if c.mems is None else format_list(c.mems),
        "memory": [{"resource": m.resource, "numa_nodes": list(m.nodes), "bytes": m.size}
                   for m in c.memory],
        "devices": {k: list(v) for k, v in c.devices.items()},
        "device_numa_nodes": {k: sorted(v) for k, v in sorted(c.device_nodes.items())},
        "cgroup": {"path": c.cgroup.path,
                   "cpus": None if c.cgroup.cpus is None else format_list(c.cgroup.cpus),
                   "mems": None if c.cgroup.mems is None else format_list(c.cgroup.mems),
                   "problem": c.cgroup.problem or None},
        "drift": list(c.drift),
    }


def _row(c: ContainerView) -> tuple[str, ...]:
    mode = "exclusive" if c.exclusive else "shared" if c.in_ledger else "shared (adopted)"
    return (_pod(c), c.name, c.id[:SHORT_ID], c.qos.value if c.qos else "-", mode,
            _cpus(c.cpus), "-" if c.mems is None else format_list(c.mems),
            ", ".join(_memory(m) for m in c.memory) or "-",
            _devices(c), _cgroup_state(c))


def _devices(c: ContainerView) -> str:
    """Devices the engine allocated (``resource=ids``), else those the runtime gave the
    container (``resource on <NUMA nodes>``)."""
    allocated = [f"{res}={','.join(ids)}" for res, ids in sorted(c.devices.items()) if ids]
    given = [f"{res} on {format_list(nodes)}" for res, nodes in sorted(c.device_nodes.items())
             if res not in c.devices]
    return ", ".join(allocated + given) or "-"


def _cgroup_state(c: ContainerView) -> str:
    if c.drift:
        return "DRIFT"
    if c.cgroup.problem:
        return c.cgroup.problem
    return "not found" if c.cgroup.path is None else "ok"


def _memory(m: MemoryHeld) -> str:
    return f"{m.resource} {format_binary(m.size)} on {format_list(m.nodes)}"


def _pod(c: ContainerView) -> str:
    if c.pod is None:
        return "?"
    if not c.pod.namespace and not c.pod.name:
        return "-"
    return f"{c.pod.namespace}/{c.pod.name}"


def _reserved(view: StateView) -> str:
    if view.reserved is None:
        return "not in the checkpoint (give --config to compute them)"
    return _cpus(view.reserved)


def _policies(view: StateView) -> str:
    r = view.recorded
    return (f"topology {r.topology_manager_policy}, CPU {r.cpu_manager_policy}, memory "
            f"{r.memory_manager_policy}")


def _tree(view: StateView) -> str:
    if view.cgroups is None:
        return "not checked"
    return f"v{view.cgroups.version} at {view.cgroups.mount}"


def _cpus(cpus: frozenset[int]) -> str:
    return format_list(cpus) or "none"
