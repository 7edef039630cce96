"""The pods the vm tier runs in the guest (tests/e2e_vm/guest_pods.py), sized from the layout, and
the CPU facts the checks need. Every scenario keeps the first core (the siblings of CPU 0) as
reservedSystemCPUs, as a node with full-pcpus-only would."""

from __future__ import annotations

from nri_numa.engine.cpu.take import take_cpus
from nri_numa.engine.cpu.topology import cpu_topology
from tests.e2e_vm.layout import LAYOUT_NIC_RESOURCE, Layout, Node

MEMORY_TOUCHED_MIB = 256
# Beyond what a container touches, its memory limit leaves this much for the rest of it.
MEMORY_HEADROOM_MIB = 64


def touch_memory(mib: int) -> list[str]:
    """A container command that holds ``mib`` of anonymous memory: busybox dd reads that much of
    /dev/zero into its one buffer, then blocks writing it into a pipe nobody reads."""
    return ["sh", "-c", f"dd if=/dev/zero bs={mib}M count=1 | sleep 86400"]

HUGEPAGES_MIB = 16


def cpu_nodes(layout: Layout) -> list[Node]:
    return [n for n in layout.nodes if n.cpus]


def reserved_cpus(layout: Layout) -> tuple[int, ...]:
    return cpu_nodes(layout)[0].siblings[0]


def threads(layout: Layout) -> int:
    return layout.threads_per_core


def whole_node(layout: Layout) -> Node:
    """The largest node without reserved CPUs (the first one when none is free of them)."""
    free = [n for n in cpu_nodes(layout) if not set(n.cpus) & set(reserved_cpus(layout))]
    return max(free or cpu_nodes(layout), key=lambda n: len(n.cpus))


def base_config(layout: Layout) -> dict[str, object]:
    return {"cpuManagerPolicy": "static",
            "reservedSystemCPUs": ",".join(map(str, reserved_cpus(layout))),
            "topologyManagerPolicy": "single-numa-node",
            "cpuManagerPolicyOptions": {"full-pcpus-only": "true"}}


def memory_config(layout: Layout) -> dict[str, object]:
    return {**base_config(layout), "memoryManagerPolicy": "Static",
            "reservedMemory": [{"numaNode": cpu_nodes(layout)[0].id, "limits": {"memory": "256Mi"}}]}


def cpu_pods(layout: Layout) -> list[dict[str, object]]:
    """Whole cores and a whole node under full-pcpus-only, and two the kubelet refuses: a
    count that is not a multiple of the threads per core, and more CPUs than any node has."""
    t = threads(layout)
    largest = max(len(n.cpus) for n in cpu_nodes(layout))
    # The refusals come first, while every node has free CPUs: with none free the kubelet's
    # topology manager refuses any request before the CPU manager checks SMT alignment.
    pods: list[dict[str, object]] = [{"name": "besteffort", "besteffort": True}]
    if t > 1:  # one CPU: fits any node, and is no multiple of the threads per core
        pods.append({"name": "not-whole-cores", "cpu_m": 1000})
    if len(cpu_nodes(layout)) > 1:
        pods.append({"name": "wider-than-a-node", "cpu_m": (largest + t) * 1000})
    pods += [{"name": "whole-node", "cpu_m": len(whole_node(layout).cpus) * 1000},
             {"name": "one-core", "cpu_m": t * 1000}]
    return pods


def cores_left(layout: Layout) -> int:
    """Whole cores no cpu scenario pod nor the reservation takes (nodes of one core size)."""
    every_cpu = sum(len(n.cpus) for n in cpu_nodes(layout))
    taken = len(reserved_cpus(layout)) + len(whole_node(layout).cpus) + threads(layout)
    return (every_cpu - taken) // threads(layout)


def memory_pods(layout: Layout) -> list[dict[str, object]]:
    return [{"name": "touches-memory", "cpu_m": threads(layout) * 1000,
             "memory_mib": MEMORY_TOUCHED_MIB + MEMORY_HEADROOM_MIB, "command": touch_memory(MEMORY_TOUCHED_MIB),
             "wait_anon_mib": MEMORY_TOUCHED_MIB}]


def memory_only_nodes(layout: Layout) -> list[Node]:
    return [n for n in layout.nodes if not n.cpus]


def wider_than_a_node_mib(layout: Layout) -> int:
    """What the wide-memory pod touches: more than any node with CPUs has, so its CPUs' node
    alone cannot hold it."""
    return max(n.memory_mib for n in cpu_nodes(layout)) + MEMORY_HEADROOM_MIB


def wide_memory_pods(layout: Layout) -> list[dict[str, object]]:
    """One core and more memory than any node with CPUs has. nri-numa's Memory Manager gives
    memory-only nodes no allocatable memory (docs/devices.md), so its memory hints are the groups
    of nodes with CPUs that hold it; best-effort admits the CPU hint of one node inside such a
    group (restricted would refuse: the providers' masks differ) and the Memory Manager extends
    it to the group."""
    wide = wider_than_a_node_mib(layout)
    return [{"name": "wide-memory", "cpu_m": threads(layout) * 1000, "memory_mib": wide + MEMORY_HEADROOM_MIB,
             "command": touch_memory(wide), "wait_anon_mib": wide}]


def wide_memory_config(layout: Layout) -> dict[str, object]:
    return {**memory_config(layout), "topologyManagerPolicy": "best-effort"}


# The container maps HUGEPAGES_MIB of anonymous 2 MiB pages (MAP_HUGETLB) and writes one byte
# into each, so the kernel takes every page from a node's pool. The busybox image has no Python:
# the guest's /usr is mounted read-only at /host/usr and its python3 started through its loader.
MAP_HUGETLB = 0x40000
GUEST_USR = "/host/usr"
TOUCH_HUGEPAGES_PY = (
    "import mmap, sys, time\n"
    f"size = {HUGEPAGES_MIB} << 20\n"
    f"m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | {MAP_HUGETLB:#x})\n"
    "for offset in range(0, size, 2 << 20):\n"
    "    m[offset] = 1\n"
    "print('touched', flush=True)\n"
    "time.sleep(86400)\n")
TOUCH_HUGEPAGES = [f"{GUEST_USR}/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                   "--library-path", f"{GUEST_USR}/lib/x86_64-linux-gnu",
                   f"{GUEST_USR}/bin/python3", "-S", "-c", TOUCH_HUGEPAGES_PY]


def hugepage_pods(layout: Layout) -> list[dict[str, object]]:
    return [{"name": "hugepages", "cpu_m": threads(layout) * 1000, "memory_mib": 64,
             "hugepages_2m_mib": HUGEPAGES_MIB, "command": TOUCH_HUGEPAGES,
             "mounts": [["/usr", GUEST_USR]], "env": {"PYTHONHOME": GUEST_USR},
             "wait_hugetlb_mib": HUGEPAGES_MIB}]


RECONCILE_PERIOD_S = 2
ONE_VERSION = "2.1.9"  # runs the scenarios where the containerd version does not matter


def distribute_config(layout: Layout) -> dict[str, object]:
    """distribute-cpus-across-numa under topologyManagerPolicy none: no NUMA hint narrows the
    choice first, so the option alone decides which nodes a pod wider than a node gets."""
    return {**base_config(layout), "topologyManagerPolicy": "none",
            "cpuManagerPolicyOptions": {"full-pcpus-only": "true", "distribute-cpus-across-numa": "true"}}


def free_per_node(layout: Layout) -> dict[int, int]:
    reserved = set(reserved_cpus(layout))
    return {n.id: len(set(n.cpus) - reserved) for n in cpu_nodes(layout)}


def spread_cpus(layout: Layout) -> int:
    """A pod wider than any node: twice the largest node's free CPUs where two nodes have that
    many (an even split is possible), else the largest node and one core more. 0: one node only."""
    free = sorted(free_per_node(layout).values(), reverse=True)
    if len(free) < 2:
        return 0
    if free[0] == free[1]:
        return 2 * free[0]
    return free[0] + threads(layout) if free[0] + threads(layout) <= sum(free) else 0


def engine_choice(layout: Layout, count: int, distribute: bool) -> frozenset[int]:
    """The CPUs nri-numa's engine takes for ``count`` whole cores out of every CPU but the
    reserved ones, on the layout's CPUs (each core named by its first CPU)."""
    records = [{"cpu": cpu, "core": core[0], "socket": n.socket, "numa": n.id}
               for n in cpu_nodes(layout) for core in n.siblings for cpu in core]
    available = {r["cpu"] for r in records} - set(reserved_cpus(layout))
    return take_cpus(cpu_topology(records), available, count, distribute_across_numa=distribute,
                     cpu_group_size=threads(layout))


def distribute_pods(layout: Layout) -> list[dict[str, object]]:
    return [{"name": "spread", "cpu_m": spread_cpus(layout) * 1000}]


def nic_pods(layout: Layout) -> list[dict[str, object]]:
    """A NIC asked for by annotation (docs/annotations.md): its CPUs follow it to its node."""
    return [{"name": "wants-nic", "cpu_m": threads(layout) * 1000,
             "annotations": {"numa.nri.io/devices.work": f"{LAYOUT_NIC_RESOURCE}=1"}}]


def churn_scenario(layout: Layout) -> dict[str, object]:
    """A Guaranteed pod and a BestEffort one stay; one-core pods are created and removed in a
    loop (one kept alive at a time) while the agent is killed with SIGKILL, a pod is created
    with no agent, containerd is restarted, a new agent starts, containerd restarts again."""
    return {"name": "churn", "config": {**base_config(layout), "cpuManagerReconcilePeriod": f"{RECONCILE_PERIOD_S}s"},
            "pods": [{"name": "besteffort", "besteffort": True},
                     {"name": "stays", "cpu_m": threads(layout) * 1000}],
            "churn": {"cpu_m": threads(layout) * 1000, "keep": 1, "max_pods": 40, "pause_s": 1.0,
                      "before_kill_s": 8.0, "after_restart_s": 6.0, "join_timeout_s": 180.0}}


def plan(layout: Layout, containerd: str) -> dict[str, object]:
    # The cpu scenario also widens two cpusets behind the agent's back (drift repair), then
    # kills the agent and starts it again on its state (restart), then runs one more pod.
    cpu = {"name": "cpu", "config": {**base_config(layout), "cpuManagerReconcilePeriod": f"{RECONCILE_PERIOD_S}s"},
           "pods": cpu_pods(layout), "drift": ["one-core", "besteffort"], "restart": True,
           "pods_after_restart": [{"name": "after-restart", "cpu_m": threads(layout) * 1000}]
           if cores_left(layout) else []}
    scenarios = [cpu,
                 {"name": "memory", "config": memory_config(layout), "pods": memory_pods(layout)}]
    if any(d.kind == "nic" for d in layout.pci):
        scenarios.append({"name": "devices", "config": base_config(layout), "pods": nic_pods(layout)})
    if containerd == ONE_VERSION:
        scenarios.append(churn_scenario(layout))
    if containerd == ONE_VERSION and spread_cpus(layout):
        scenarios.append({"name": "distribute", "config": distribute_config(layout),
                          "pods": distribute_pods(layout)})
    if any(n.hugepages_2m * 2 >= HUGEPAGES_MIB for n in layout.nodes):
        scenarios.append({"name": "hugepages", "config": memory_config(layout), "pods": hugepage_pods(layout)})
    scenarios += memory_only_node_scenarios(layout)
    return {"containerd": containerd, "scenarios": scenarios}


def memory_only_node_scenarios(layout: Layout) -> list[dict[str, object]]:
    """Where a layout has a memory-only node and two nodes with CPUs: a container's memory wider
    than a node, which the Memory Manager groups over nodes with CPUs only."""
    if not memory_only_nodes(layout) or len(cpu_nodes(layout)) < 2:
        return []
    return [{"name": "wide-memory", "config": wide_memory_config(layout), "pods": wide_memory_pods(layout)}]


def memory_plan(layout: Layout, containerd: str) -> dict[str, object]:
    """The memory scenarios alone: what a second guest, booted only for its memory-only node,
    runs (conftest.py)."""
    return {"containerd": containerd,
            "scenarios": [{"name": "memory", "config": memory_config(layout), "pods": memory_pods(layout)},
                          *memory_only_node_scenarios(layout)]}
