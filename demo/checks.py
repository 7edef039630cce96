"""What `--smoke` asserts about the rows: the Guaranteed container got exclusive CPUs that no
other container has, on one NUMA node, and the Burstable and BestEffort containers share the
rest; the cgroup files and the kernel's view from inside agree. Each problem is one sentence."""

from __future__ import annotations

from demo.rows import BESTEFFORT, BURSTABLE, GUARANTEED, MachineFacts, Row
from nri_numa.topology.cpulist import format_list, parse_list


def _fmt(ids: frozenset[int]) -> str:
    return format_list(ids) or "(none)"


def inside_matches_cgroup(row: Row) -> list[str]:
    problems = []
    if row.cpu_ids != row.inside_cpu_ids:
        problems.append(f"{row.pod}: cgroup cpuset.cpus is {row.cpus} but Cpus_allowed_list "
                        f"inside is {row.inside_cpus}")
    if row.mem_ids != row.inside_mem_ids:
        problems.append(f"{row.pod}: cgroup cpuset.mems is {row.mems} but Mems_allowed_list "
                        f"inside is {row.inside_mems}")
    return problems


def guaranteed_is_exclusive(guaranteed: Row, others: list[Row], machine: MachineFacts) -> list[str]:
    cpus = guaranteed.cpu_ids
    problems = []
    if len(cpus) != guaranteed.exclusive_cpus_asked:
        problems.append(f"{guaranteed.pod} asked for {guaranteed.exclusive_cpus_asked} CPU(s) "
                        f"but its cpuset.cpus is {guaranteed.cpus}")
    if cpus & machine.reserved:
        problems.append(f"{guaranteed.pod} got reserved CPU(s) {_fmt(cpus & machine.reserved)}")
    for other in others:
        if cpus & other.cpu_ids:
            problems.append(f"{guaranteed.pod}'s CPU(s) {_fmt(cpus & other.cpu_ids)} are also in "
                            f"{other.pod}'s cpuset {other.cpus}: not exclusive")
    nodes = {machine.node_of[c] for c in cpus if c in machine.node_of}
    if len(nodes) > 1:
        problems.append(f"{guaranteed.pod}'s CPUs {guaranteed.cpus} span NUMA nodes "
                        f"{_fmt(frozenset(nodes))} under single-numa-node")
    # The demo runs without the Memory Manager: like the kubelet, nri-numa then leaves memory
    # nodes alone, so the Guaranteed container keeps the ones every other container has.
    for other in others:
        if guaranteed.mem_ids != other.mem_ids:
            problems.append(f"{guaranteed.pod}'s memory nodes {guaranteed.mems} differ from "
                            f"{other.pod}'s {other.mems}: pinned without the Memory Manager")
    return problems


def shared_pool_is_the_rest(shared: list[Row], guaranteed: Row, machine: MachineFacts) -> list[str]:
    expected = machine.online - guaranteed.cpu_ids
    return [f"{row.pod} ({row.qos}) runs on {row.cpus}, not on the shared pool {_fmt(expected)} "
            f"(online CPUs {_fmt(machine.online)} minus {guaranteed.pod}'s)"
            for row in shared if row.cpu_ids != expected]


def check_placements(rows: tuple[Row, ...], machine: MachineFacts, besteffort_before: str) -> list[str]:
    """Every way the rows differ from what the static policy promises; empty when all is well."""
    by_qos = {qos: [r for r in rows if r.qos == qos] for qos in (GUARANTEED, BURSTABLE, BESTEFFORT)}
    missing = [qos for qos, found in by_qos.items() if len(found) != 1]
    if missing:
        return [f"expected one container of each QoS class, got {len(rows)} rows "
                f"({', '.join(r.qos for r in rows) or 'none'})"]
    guaranteed = by_qos[GUARANTEED][0]
    shared = by_qos[BURSTABLE] + by_qos[BESTEFFORT]
    problems = [p for row in rows for p in inside_matches_cgroup(row)]
    problems += guaranteed_is_exclusive(guaranteed, shared, machine)
    problems += shared_pool_is_the_rest(shared, guaranteed, machine)
    if parse_list(besteffort_before) != machine.online:
        problems.append(f"before the Guaranteed pod the BestEffort container ran on "
                        f"{besteffort_before or '(nothing read)'}, not on every online CPU "
                        f"({_fmt(machine.online)})")
    return problems
