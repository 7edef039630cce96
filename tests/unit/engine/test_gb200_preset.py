"""The GB200-like preset: Grace CPUs, GPUs whose memory is CPU-less NUMA nodes; the engine puts
neither CPUs nor container memory there."""

from __future__ import annotations

from nri_numa.engine import EngineContext, admit
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.topology.synthetic import preset_topology

GIB = 1 << 30


def test_the_shape():
    t = preset_topology("gb200")
    cpu_nodes = [n for n in t.numa_nodes if n.cpus]
    gpu_nodes = [n for n in t.numa_nodes if not n.cpus]
    assert [len(n.cpus) for n in cpu_nodes] == [72, 72]
    assert [n.id for n in gpu_nodes] == [2, 3, 4, 5]
    assert all(n.memory_bytes == 186 * GIB for n in gpu_nodes)
    assert all(n.distances[m.id] == 80 for n in gpu_nodes for m in t.numa_nodes if m is not n)
    assert [g.numa_node for g in t.gpus] == [0, 0, 1, 1]
    assert len(t.nics) == 4 and all(c.core == c.id for c in t.cpus)  # no SMT


def _pod(name: str, cpu: str, memory: str) -> object:
    return pod_from_manifest({"metadata": {"name": name}, "spec": {"containers": [
        {"name": "main", "resources": {"limits": {"cpu": cpu, "memory": memory}}}]}})


def test_container_memory_never_lands_on_gpu_memory():
    ctx = EngineContext.build(preset_topology("gb200"), config_from_mapping({
        "topologyManagerPolicy": "best-effort", "cpuManagerPolicy": "static",
        "reservedSystemCPUs": "0", "memoryManagerPolicy": "Static",
        "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]}))
    allocs = ctx.empty_allocations()
    nodes = allocs.memory.nodes
    assert all(nodes[n].tables["memory"].allocatable == 0 for n in (2, 3, 4, 5))
    assert nodes[1].tables["memory"].allocatable > 400 * GIB
    seen = set()
    for i, (cpu, memory) in enumerate([("500m", "400Gi"), ("4", "300Gi"), ("500m", "180Gi")]):
        result = admit(ctx, allocs, _pod(f"p{i}", cpu, memory))
        allocs = result.allocations
        for placement in result.decision.placements:
            seen |= set(placement.mems or ()) | ctx.nodes_of_cpus(placement.cpus)
    # The third pod fits only a GPU memory node (186 GiB there; 70 and 172 GiB left on the
    # Graces together): it is refused rather than put there.
    assert seen <= {0, 1}
    assert result.decision.rejection is not None
