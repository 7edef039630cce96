"""The NRI plugin on a real multi-NUMA kernel, cgroup v2 and the systemd cgroup driver, with
containerd 1.7.24 and 2.1.9 (SystemdCgroup = true): whole cores in one node under single-numa-node
and full-pcpus-only, the kubelet's refusals, the shared pool, the Memory Manager's static policy
(memory really on the chosen node), 2 MiB huge pages from that node, and `nri-numa state` reading
the systemd scopes back. Each containerd version runs every scenario once in the guest
(conftest.pods_run, tests/e2e_vm/guest_pods.py); what the tests read is what the kernel says:
cpuset.cpus.effective, Cpus_allowed_list inside the container, memory.numa_stat."""

from __future__ import annotations

import json

import pytest

from nri_numa.topology.cpulist import parse_list
from tests.e2e_vm import guest_plan
from tests.e2e_vm.layout import Layout

pytestmark = pytest.mark.vm
MiB = 1 << 20
ON_NODE_SHARE = 0.95
REPAIR_MARGIN_S = 10.0  # a loaded TCG guest on 2 host CPUs


def scenario(pods_run: dict, name: str) -> dict:
    got = pods_run["scenarios"][name]
    assert "error" not in got, f"{got['error']}\nagent log:\n{got['agent_log'][-3000:]}"
    return got


def pod(got: dict, name: str) -> dict:
    placed = got["pods"][name]
    assert placed["created"], f"{name}: {placed.get('error')}\nagent log:\n{got['agent_log'][-3000:]}"
    return placed


def nodes_of(layout: Layout, cpus: frozenset[int]) -> set[int]:
    return {n.id for n in layout.nodes if cpus & set(n.cpus)}


def slice_path(unit: str) -> str:
    """systemd nests a-b-c.slice in a.slice/a-b.slice."""
    parts = unit.removesuffix(".slice").split("-")
    return "".join("/" + "-".join(parts[:i + 1]) + ".slice" for i in range(len(parts)))


def test_guaranteed_pods_get_whole_cores_inside_one_node(pods_run: dict, vm_layout: Layout) -> None:
    got = scenario(pods_run, "cpu")
    reserved = set(guest_plan.reserved_cpus(vm_layout))
    cores = [set(group) for n in vm_layout.nodes for group in n.siblings]
    taken: set[int] = set()
    for name, wanted in (("whole-node", len(guest_plan.whole_node(vm_layout).cpus)),
                         ("one-core", guest_plan.threads(vm_layout))):
        placed = pod(got, name)
        cpus = parse_list(placed["cpus_effective"])
        assert parse_list(placed["cpus"]) == cpus == parse_list(placed["inside_cpus"]), placed
        assert len(cpus) == wanted, placed
        assert len(nodes_of(vm_layout, cpus)) == 1, f"{name}: {placed['cpus_effective']} spans nodes"
        assert all(core <= cpus or not core & cpus for core in cores), f"{name}: a core split in {cpus}"
        assert not cpus & reserved and not cpus & taken, placed
        taken |= cpus
    node_cpus = parse_list(pod(got, "whole-node")["cpus_effective"])
    assert node_cpus == set(vm_layout.node(nodes_of(vm_layout, node_cpus).pop()).cpus)


def test_the_kubelets_refusals_reach_containerd(pods_run: dict, vm_layout: Layout) -> None:
    got = scenario(pods_run, "cpu")
    if "not-whole-cores" in got["pods"]:
        assert not got["pods"]["not-whole-cores"]["created"]
        assert "SMT Alignment Error" in got["pods"]["not-whole-cores"]["error"]
    if "wider-than-a-node" in got["pods"]:
        assert not got["pods"]["wider-than-a-node"]["created"]
        assert "TopologyAffinityError" in got["pods"]["wider-than-a-node"]["error"]


def test_the_shared_pool_is_what_exclusive_cpus_left(pods_run: dict, vm_layout: Layout) -> None:
    got = scenario(pods_run, "cpu")
    every_cpu = {cpu for n in vm_layout.nodes for cpu in n.cpus}
    assert parse_list(pod(got, "besteffort")["inside_cpus"]) == every_cpu  # before any exclusive one
    exclusive = {cpu for name, placed in got["pods"].items() if placed["created"] and name != "besteffort"
                 for cpu in parse_list(placed["cpus"])}
    assert exclusive
    assert parse_list(got["cpus_effective_at_end"]["besteffort"]) == every_cpu - exclusive


def test_containers_live_in_the_systemd_drivers_scopes(pods_run: dict) -> None:
    got = scenario(pods_run, "cpu")
    for name, placed in got["pods"].items():
        if placed["created"]:
            parent, container = placed["cgroup_parent"], placed["container_id"]
            assert placed["cgroups_path"] == f"{parent}:cri-containerd:{container}", name
            assert placed["cgroup"] == f"{slice_path(parent)}/cri-containerd-{container}.scope", name


def test_state_reads_the_scopes_back_without_drift(pods_run: dict) -> None:
    got = scenario(pods_run, "cpu")
    assert got["state"]["status"] == 0, got["state"]
    state = json.loads(got["state"]["stdout"])
    assert state["drifted"] == 0
    by_id = {c["id"]: c for c in state["containers"]}
    for name, placed in got["pods"].items():
        if placed["created"]:
            seen = by_id[placed["container_id"]]
            assert seen["cgroup"]["path"] == placed["cgroup"], name
            assert seen["cgroup"]["problem"] is None, name
            assert parse_list(seen["cgroup"]["cpus"]) == parse_list(got["cpus_effective_at_end"][name]), name


@pytest.mark.memory_only_node
def test_the_static_memory_manager_keeps_memory_on_the_chosen_node(pods_run: dict, vm_layout: Layout) -> None:
    placed = pod(scenario(pods_run, "memory"), "touches-memory")
    (node,) = nodes_of(vm_layout, parse_list(placed["cpus_effective"]))
    assert placed["mems"] == placed["mems_effective"] == placed["inside_mems"] == str(node), placed
    anon = {int(k): v for k, v in placed["numa_stat"]["anon"].items()}
    assert sum(anon.values()) >= guest_plan.MEMORY_TOUCHED_MIB * MiB, anon
    assert anon[node] >= ON_NODE_SHARE * sum(anon.values()), f"node {node}: {anon}"


@pytest.mark.memory_only_node(exclusively=True)
@pytest.mark.parametrize("pods_run", [guest_plan.ONE_VERSION], indirect=True)
def test_memory_wider_than_a_node_overflows_to_a_cpu_node_never_a_memory_only_one(pods_run: dict,
                                                                                 vm_layout: Layout) -> None:
    """A one-core container touching more memory than its node has (static Memory Manager,
    topology policy best-effort; guest_plan.wide_memory_pods): cpuset.mems is its CPUs' node and
    another node with CPUs, and the pages its node cannot hold come from that node. A memory-only
    node is not in cpuset.mems, and it and every other node get at most 1 - ON_NODE_SHARE of the
    pages, though on cxl it is the nearest to node 0, where the kernel alone would put them."""
    placed = pod(scenario(pods_run, "wide-memory"), "wide-memory")
    (node,) = nodes_of(vm_layout, parse_list(placed["cpus_effective"]))
    mems = parse_list(placed["mems_effective"])
    assert placed["mems"] == placed["mems_effective"] == placed["inside_mems"], placed
    assert len(mems) == 2 and node in mems, placed
    (other,) = mems - {node}
    assert vm_layout.node(other).cpus, f"cpuset.mems {placed['mems']}: node {other} has no CPUs"
    touched = guest_plan.wider_than_a_node_mib(vm_layout) * MiB
    anon = {int(k): v for k, v in placed["numa_stat"]["anon"].items()}
    assert sum(anon.values()) >= touched, anon
    elsewhere = sum(anon.values()) - anon[node] - anon[other]
    assert elsewhere <= (1 - ON_NODE_SHARE) * sum(anon.values()), f"nodes {sorted(mems)}: {anon}"
    assert anon[other] >= touched - vm_layout.node(node).memory_mib * MiB - elsewhere, f"node {other}: {anon}"


def test_hugepages_are_placed_on_a_node_that_has_them(pods_run: dict, vm_layout: Layout) -> None:
    if "hugepages" not in pods_run["scenarios"]:
        pytest.skip(f"no node of layout {vm_layout.name} has {guest_plan.HUGEPAGES_MIB} MiB of 2 MiB pages")
    got = scenario(pods_run, "hugepages")
    placed = pod(got, "hugepages")
    assert placed["hugetlb_2mb_max"] == str(guest_plan.HUGEPAGES_MIB * MiB)
    node = int(placed["mems_effective"])
    assert node in nodes_of(vm_layout, parse_list(placed["cpus_effective"]))
    assert vm_layout.node(node).hugepages_2m * 2 >= guest_plan.HUGEPAGES_MIB
    records = json.loads(got["state"]["stdout"])["containers"][0]["memory"]
    assert {"resource": "hugepages-2Mi", "numa_nodes": [node], "bytes": guest_plan.HUGEPAGES_MIB * MiB} in records


def test_the_huge_pages_a_container_touches_come_from_the_chosen_nodes_pool(pods_run: dict,
                                                                           vm_layout: Layout) -> None:
    """The container maps HUGEPAGES_MIB of MAP_HUGETLB memory and writes into every page: the
    pages leave the chosen node's free_hugepages and no other node's."""
    if "hugepages" not in pods_run["scenarios"]:
        pytest.skip(f"no node of layout {vm_layout.name} has {guest_plan.HUGEPAGES_MIB} MiB of 2 MiB pages")
    placed = pod(scenario(pods_run, "hugepages"), "hugepages")
    node = int(placed["mems_effective"])
    pages = guest_plan.HUGEPAGES_MIB // 2
    assert placed["hugetlb_2mb_current"] == guest_plan.HUGEPAGES_MIB * MiB, placed
    before = {int(k): v for k, v in placed["free_hugepages_before"].items()}
    after = {int(k): v for k, v in placed["free_hugepages_after"].items()}
    dropped = {n: before[n] - after[n] for n in before}
    assert dropped == {n: pages if n == node else 0 for n in before}, f"node {node}: {before} -> {after}"
    assert {int(k): v for k, v in placed["huge_pages_by_node"].items()} == {node: pages}, placed


def test_without_the_memory_manager_mems_are_left_alone(pods_run: dict, vm_layout: Layout) -> None:
    """The kubelet's CPU Manager sets no cpuset.mems: a Guaranteed container without the Memory
    Manager may take memory from every node."""
    got = scenario(pods_run, "cpu")
    every_node = {n.id for n in vm_layout.nodes}
    for name in ("whole-node", "one-core"):
        placed = pod(got, name)
        assert placed["mems"] == "", f"{name}: cpuset.mems {placed['mems']!r}"
        assert parse_list(placed["mems_effective"]) == every_node == parse_list(placed["inside_mems"]), placed


@pytest.mark.parametrize("pods_run", [guest_plan.ONE_VERSION], indirect=True)
def test_distribute_cpus_across_numa_spreads_a_wide_pod_evenly(pods_run: dict, vm_layout: Layout) -> None:
    """A Guaranteed pod wider than any node, under distribute-cpus-across-numa (topology policy
    none): its whole cores split evenly over the fewest nodes that hold it, and they are the
    distributed algorithm's CPUs (on snc2 not the packed algorithm's: see test_layout.py)."""
    wanted = guest_plan.spread_cpus(vm_layout)
    if not wanted:
        pytest.skip(f"layout {vm_layout.name} has no two nodes with free CPUs")
    placed = pod(scenario(pods_run, "distribute"), "spread")
    cpus = parse_list(placed["cpus_effective"])
    assert parse_list(placed["cpus"]) == cpus == parse_list(placed["inside_cpus"]), placed
    assert len(cpus) == wanted and not cpus & set(guest_plan.reserved_cpus(vm_layout)), placed
    per_node = {n: len(cpus & set(vm_layout.node(n).cpus)) for n in nodes_of(vm_layout, cpus)}
    free = sorted(guest_plan.free_per_node(vm_layout).values(), reverse=True)
    fewest = next(k for k in range(1, len(free) + 1) if sum(free[:k]) >= wanted)
    assert len(per_node) == fewest, per_node
    assert max(per_node.values()) - min(per_node.values()) <= guest_plan.threads(vm_layout), per_node
    cores = [set(group) for n in vm_layout.nodes for group in n.siblings]
    assert all(core <= cpus or not core & cpus for core in cores), f"a core split in {cpus}"
    assert cpus == guest_plan.engine_choice(vm_layout, wanted, distribute=True), placed


def test_a_cpuset_changed_behind_the_agents_back_is_repaired(pods_run: dict) -> None:
    """cpuset.cpus of a scope widened to every CPU; the periodic check puts it back through NRI
    (containerd, runc update, systemd's AllowedCPUs)."""
    got = scenario(pods_run, "cpu")
    for name, drift in got["drift"].items():
        assert drift["widened"] != drift["before"], name
        assert drift["repaired_after_s"] is not None, f"{name}: still {drift['still']}, not {drift['before']}"
        assert drift["repaired_after_s"] <= guest_plan.RECONCILE_PERIOD_S + REPAIR_MARGIN_S, name
        assert drift["effective"] == drift["before"], name
    assert got["agent_log"].count("(its cgroup differed at the periodic check)") >= len(got["drift"])


def test_a_restarted_agent_keeps_every_container_where_it_was(pods_run: dict, vm_layout: Layout) -> None:
    got = scenario(pods_run, "cpu")
    restart = got["restart"]
    assert restart["cpus_effective"] == restart["cpus_effective_before"]
    if "after-restart" not in got["pods"]:
        return  # no whole core left in this layout for one more pod
    after = parse_list(pod(got, "after-restart")["cpus_effective"])
    assert len(after) == guest_plan.threads(vm_layout) and len(nodes_of(vm_layout, after)) == 1
    for name, cpus in restart["cpus_effective_before"].items():
        if name != "besteffort":
            assert not after & parse_list(cpus), f"after-restart got {after}, {name} has {cpus}"


def test_a_nic_asked_by_annotation_brings_the_cpus_to_its_node(pods_run: dict, vm_layout: Layout) -> None:
    if "devices" not in pods_run["scenarios"]:
        pytest.skip(f"layout {vm_layout.name} has no NIC")
    got = scenario(pods_run, "devices")
    placed = pod(got, "wants-nic")
    nic_nodes = {d.node for d in vm_layout.pci if d.kind == "nic"}
    (node,) = nodes_of(vm_layout, parse_list(placed["cpus_effective"]))
    assert node in nic_nodes, f"CPUs on node {node}, the NICs on {sorted(nic_nodes)}"
    (record,) = json.loads(got["state"]["stdout"])["containers"]
    assert list(record["devices"]) == [guest_plan.LAYOUT_NIC_RESOURCE]
    assert f"devices {guest_plan.LAYOUT_NIC_RESOURCE}=" in got["agent_log"]


@pytest.mark.parametrize("pods_run", [guest_plan.ONE_VERSION], indirect=True)
def test_after_agent_kills_and_containerd_restarts_during_churn_no_cpu_is_held_twice(pods_run: dict,
                                                                                      vm_layout: Layout) -> None:
    """Pods created and removed in a loop while the agent is SIGKILLed, a pod is created with no
    agent, containerd restarts, a new agent starts and containerd restarts again under it.
    Pods whose calls failed while containerd was down are removed, as the kubelet would.
    Afterwards, read from the cgroup of every container containerd has (created or running):
    each exclusive CPU is in exactly one container's cpuset, no shared container has one, and
    `nri-numa state` finds these containers, and no others, with the cpusets their cgroups
    hold (exit status 0)."""
    got = scenario(pods_run, "churn")
    churn = got["churn"]
    assert churn["churn_stopped"], churn["events"]
    assert any("created" in what for _, what in churn["events"] if str(what).startswith("churn-")), churn["events"]
    assert got["state"]["status"] == 0, f"{got['state']}\nevents: {churn['events']}"
    state = json.loads(got["state"]["stdout"])
    running = got["live_containers"]
    records = {c["id"]: c for c in state["containers"]}
    assert set(records) == set(running), f"state {sorted(records)}, containerd {running}\nevents: {churn['events']}"
    exclusive: dict[int, str] = {}
    for container, files in running.items():
        record = records[container]
        cpus = parse_list(files["cpus_effective"])
        assert parse_list(record["cgroup"]["cpus"]) == parse_list(files["cpus"]) == cpus, (record, files)
        assert parse_list(record["cpus"]) == cpus, (record, files)
        if record["exclusive"]:
            for cpu in cpus:
                assert cpu not in exclusive, f"CPU {cpu} in {container} and {exclusive[cpu]}"
                exclusive[cpu] = container
    assert exclusive, "no exclusive container survived the churn"
    for container, files in running.items():
        if not records[container]["exclusive"]:
            shared = parse_list(files["cpus_effective"])
            assert not shared & set(exclusive), f"shared {container} has exclusive CPUs {shared & set(exclusive)}"
            assert shared == parse_list(state["shared_pool"]), (container, files, state["shared_pool"])
