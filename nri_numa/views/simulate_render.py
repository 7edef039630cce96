"""A simulation for people (an aligned table and two summaries) and for programs (JSON)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.context import EngineContext
from nri_numa.engine.decision import Placement
from nri_numa.engine.devices import device_id_key
from nri_numa.engine.hints import Hint
from nri_numa.topology.cpulist import format_list
from nri_numa.topology.render import align, gib
from nri_numa.views.simulate import Simulation, Step, StepKind

_HEADER = ("STEP", "POD", "CONTAINER", "QOS", "RESULT", "CPUS", "CPU MODE", "MEMS", "DEVICES",
           "HINT", "REASON")


def format_mask(nodes: Iterable[int] | None) -> str:
    """``{0,1}``; None (no NUMA preference) is ``any``."""
    return "any" if nodes is None else "{" + ",".join(map(str, sorted(nodes))) + "}"


def format_hint(hint: Hint) -> str:
    """A hint as ``{0,1}``, with ``*`` when preferred."""
    return format_mask(hint.affinity) + ("*" if hint.preferred else "")


def render_text(sim: Simulation) -> str:
    names = device_names(sim.ctx)
    rows = [_HEADER]
    for step in sim.steps:
        rows += _step_rows(step, names)
    lines = align(rows)
    lines += ["", f"shared pool: {_cpus(sim.allocations.shared)}"]
    lines += _shared_container_lines(sim)
    lines += ["", *align(node_rows(sim.ctx, sim.allocations))]
    if sim.errors:
        lines += ["", f"{len(sim.errors)} bad entries in the pods file (see the error rows)"]
    return "\n".join(lines)


def render_json(sim: Simulation) -> str:
    return json.dumps(simulation_dict(sim), indent=2)


def simulation_dict(sim: Simulation) -> dict[str, Any]:
    header, *rows = node_rows(sim.ctx, sim.allocations)
    keys = [h.lower().replace(" ", "_") for h in header]
    return {
        "steps": [s.to_dict() for s in sim.steps],
        "shared_pool": format_list(sim.allocations.shared),
        "shared_containers": [{"pod": pod, "container": name,
                               "cpus": format_list(sim.allocations.shared)}
                              for pod, name in sim.shared_containers()],
        "nodes": [dict(zip(keys, row)) for row in rows],
        "errors": len(sim.errors),
    }


def _step_rows(step: Step, names: Mapping[str, str]) -> list[tuple[str, ...]]:
    number, pod = str(step.number), step.pod or "-"
    if step.kind is StepKind.ERROR:
        return [(number, pod, "-", "-", "invalid", *["-"] * 5, f"{step.where}: {step.message}")]
    if step.kind is StepKind.DELETE:
        return [(number, pod, "-", "-", "deleted", *["-"] * 5, step.message)]
    decision, qos = step.decision, str(step.qos)
    assert decision is not None  # an admit step always carries its decision
    if decision.rejection is not None:
        r = decision.rejection
        return [(number, pod, r.container or "(pod)", qos, "refused", *["-"] * 5, r.message)]
    return [(number, pod, p.container, qos, "admitted", *placement_cells(p, names), "")
            for p in decision.placements]


def placement_cells(p: Placement, names: Mapping[str, str]) -> tuple[str, ...]:
    devices = " ".join(
        f"{resource}={','.join(sorted((names.get(d, d) for d in ids), key=device_id_key))}"
        for resource, ids in sorted(p.devices.items()) if ids)
    return (format_list(p.cpus) or "-", "exclusive" if p.exclusive else "shared",
            "-" if p.mems is None else format_list(p.mems), devices or "-", format_hint(p.hint))


def _shared_container_lines(sim: Simulation) -> list[str]:
    shared = sim.shared_containers()
    if not shared:
        return []
    # Every shared container follows the pool: these are the cpusets the NRI plugin pushes.
    rows = [("POD", "CONTAINER", "CPUSET NOW")]
    rows += [(pod, name, format_list(sim.allocations.shared)) for pod, name in shared]
    return ["shared containers now run on the pool as it is at the end:",
            *("  " + line for line in align(rows))]


def node_rows(ctx: EngineContext, allocs: Allocations) -> list[tuple[str, ...]]:
    """Per NUMA node: CPUs (all, exclusive, reserved, free for exclusive use), isolated CPUs
    (all, free) on a machine that has them, memory, devices."""
    exclusive = allocs.exclusive_cpus()
    isolated = ctx.isolated_cpus
    header = ("NODE", "CPUS", "EXCLUSIVE", "RESERVED", "FREE CPUS",
              *(("ISOLATED", "FREE ISOLATED") if isolated else ()), "FREE MEMORY",
              *(f"FREE {name}" for name in sorted(ctx.devices)))
    rows = [header]
    for node in ctx.topology.numa_nodes:
        cpus = node.cpus
        free_cpus = (allocs.shared - ctx.reserved_cpus - isolated) & cpus
        free_isolated = isolated & cpus - exclusive - ctx.reserved_cpus
        rows.append((str(node.id), str(len(cpus)), str(len(exclusive & cpus)),
                     str(len(ctx.reserved_cpus & cpus)), str(len(free_cpus)),
                     *((format_list(isolated & cpus) or "-", str(len(free_isolated)))
                       if isolated else ()),
                     _free_memory(allocs, node.id),
                     *(_free_devices(ctx, allocs, name, node.id) for name in sorted(ctx.devices))))
    return rows


def _free_memory(allocs: Allocations, node_id: int) -> str:
    if allocs.memory is None:
        return "untracked"  # memoryManagerPolicy None: the kernel decides, nothing is reserved
    table = allocs.memory.nodes[node_id].tables.get("memory")
    return "-" if table is None else f"{gib(table.free)} of {gib(table.allocatable)}"


def _free_devices(ctx: EngineContext, allocs: Allocations, resource: str, node_id: int) -> str:
    devices = [d for d in ctx.devices[resource].devices if node_id in d.numa_nodes]
    used = allocs.devices_in_use(resource)
    free = sum(1 for d in devices if d.healthy and d.id not in used)
    return f"{free} of {len(devices)}"


def device_names(ctx: EngineContext) -> dict[str, str]:
    """Device id → a short name: GPUs by their NVML index, as ``nri-numa topology`` shows them."""
    return {g.uuid: f"GPU{g.index}" for g in ctx.topology.gpus}


def _cpus(cpus: frozenset[int]) -> str:
    return f"{format_list(cpus) or '-'} ({len(cpus)} CPUs)"
