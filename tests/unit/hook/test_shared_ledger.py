"""The ledger the hook processes share: admission from a spec, shared-pool moves, release,
garbage collection by process identity, and the checkpoint payload it round-trips through."""

from __future__ import annotations

import json

import pytest

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.hook.shared_ledger import (PENDING_GRACE_S, Move, ProcessRecord, Refused,
                                         SharedLedger, StateError)
from nri_numa.runtime import DeviceLocator
from nri_numa.runtime.oci_spec import runtime_container
from nri_numa.state.plugin_records import RecordError
from nri_numa.topology.synthetic import preset_topology

MIB = 1 << 20
CONFIG = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,48",
          "topologyManagerPolicy": "single-numa-node"}


def context(preset: str = "intel-2s-ht", **overrides) -> EngineContext:
    return EngineContext.build(preset_topology(preset), config_from_mapping({**CONFIG, **overrides}))


@pytest.fixture
def ctx() -> EngineContext:
    return context()


def fresh(ctx: EngineContext) -> SharedLedger:
    return SharedLedger(ctx, DeviceLocator(ctx.topology))


def container(cid: str, cpus: int = 0, annotations: dict | None = None, **extra_annotations):
    resources = {}
    if cpus:
        resources = {"cpu": {"quota": cpus * 100000, "period": 100000},
                     "memory": {"limit": 64 * MIB}}
    spec = {"linux": {"cgroupsPath": f"/t/{cid}", "resources": resources},
            "annotations": {**(annotations or {}), **extra_annotations}}
    return runtime_container(spec, cid)


def live(pid: int) -> ProcessRecord:
    return ProcessRecord(pid, pid * 10, f"/t/{pid}", 1000.0)


def test_exclusive_placement_shrinks_the_pool_and_moves_shared_containers(ctx):
    book = fresh(ctx)
    shared = book.admit(container("s1"))
    book.attach("s1", live(100))
    assert not shared.exclusive and shared.cpus == book.shared == ctx.topology.online_cpus
    placed = book.admit(container("x1", cpus=2))
    book.attach("x1", live(101))
    assert placed.exclusive and len(placed.cpus) == 2 and not placed.cpus & {0, 48}
    assert not placed.cpus & book.shared
    moves = book.shared_moves(skip=["x1"])
    assert moves == [Move("s1", ctx.topology.online_cpus, book.shared)]
    assert moves[0].must_leave == placed.cpus
    assert book.record("s1").cpus == book.shared and book.shared_moves() == []


def test_release_gives_cpus_back_and_is_idempotent(ctx):
    book = fresh(ctx)
    book.admit(container("s1"))
    book.attach("s1", live(100))
    placed = book.admit(container("x1", cpus=4))
    book.attach("x1", live(101))
    book.shared_moves()
    assert book.release("x1") is True
    assert book.shared == ctx.topology.online_cpus
    [move] = book.shared_moves()
    assert move.new - move.old == placed.cpus and not move.must_leave
    assert book.release("x1") is False and book.release("never") is False
    assert book.process("x1") is None and book.record("x1") is None


def test_refusal_changes_nothing(ctx):
    book = fresh(ctx)
    book.admit(container("x1", cpus=4))
    book.attach("x1", live(101))
    before = book.to_payload()
    with pytest.raises(Refused, match="TopologyAffinityError|cpu") as refused:
        book.admit(container("huge", cpus=60))  # more than a node has: single-numa-node refuses
    assert "\n" not in str(refused.value)
    assert book.to_payload() == before


def test_garbage_collection_by_process_and_grace(ctx):
    book = fresh(ctx)
    for cid, pid in (("a", 1), ("b", 2), ("c", 3)):
        book.admit(container(cid, cpus=1))
        book.attach(cid, live(pid))
    book.admit(container("young", cpus=1))
    book.attach("young", ProcessRecord(None, None, None, 1000.0))
    book.admit(container("old", cpus=1))
    book.attach("old", ProcessRecord(None, None, None, 1000.0 - PENDING_GRACE_S - 1))
    gone = book.collect_garbage(lambda p: p.pid != 2, now=1000.0, keep=["c"])
    assert sorted(gone) == ["b", "old"]
    assert sorted(book.containers) == ["a", "c", "young"]
    # The freed CPUs are shared again.
    assert len(book.shared) == len(ctx.topology.online_cpus) - 3
    assert sorted(book.collect_garbage(lambda p: False, now=1000.0)) == ["a", "c"]


def test_the_payload_round_trips_through_json(ctx):
    book = fresh(ctx)
    book.admit(container("s1"))
    book.attach("s1", live(100))
    book.admit(container("x1", cpus=3))
    book.attach("x1", ProcessRecord(None, None, None, 5.5))
    book.shared_moves()
    payload = json.loads(json.dumps(book.to_payload()))
    again = SharedLedger.load(ctx, DeviceLocator(ctx.topology), payload)
    assert again.to_payload() == payload
    assert again.shared == book.shared and again.containers == book.containers
    assert again.process("x1").pending and again.process("s1") == live(100)


def test_a_fresh_start_without_a_checkpoint(ctx):
    book = SharedLedger.load(ctx, DeviceLocator(ctx.topology), None)
    assert book.containers == {} and book.shared == ctx.topology.online_cpus


def test_the_plugins_checkpoint_is_not_taken_over(ctx):
    payload = {"ledger": fresh(ctx).to_payload()["ledger"], "records": {"pods": [],
                                                                      "containers": []}}
    with pytest.raises(StateError, match="NRI plugin"):
        SharedLedger.load(ctx, DeviceLocator(ctx.topology), payload)


def test_a_state_that_does_not_fit_is_an_error_not_a_reset(ctx):
    book = fresh(ctx)
    held = book.admit(container("x1", cpus=2)).cpus
    book.attach("x1", live(1))
    payload = book.to_payload()
    locator = DeviceLocator(ctx.topology)
    with pytest.raises(StateError, match="differ: x1"):
        SharedLedger.load(ctx, locator, dict(payload, processes={}))
    with pytest.raises(StateError, match="version"):
        SharedLedger.load(ctx, locator, dict(payload, ledger=dict(payload["ledger"], version=99)))
    # The node now reserves a CPU that a running container holds.
    reserving = context(reservedSystemCPUs=f"0,48,{min(held)}")
    with pytest.raises(StateError, match="does not fit this machine and configuration"):
        SharedLedger.load(reserving, locator, payload)


def test_device_requests_are_checked_against_the_node(ctx):
    with pytest.raises(Refused, match="nvidia.com/gpu is not a device resource of this node "
                                      r"\(it has: pci/15b3:101d\)"):  # its NIC, no GPU
        fresh(ctx).admit(container("g", cpus=1), {"nvidia.com/gpu": 1})
    dgx = context("dgx-h100", reservedSystemCPUs="0")
    placed = fresh(dgx).admit(container("g", cpus=2), {"nvidia.com/gpu": 2})
    assert len(placed.devices["nvidia.com/gpu"]) == 2
    gpu_nodes = {g.numa_node for g in dgx.topology.gpus if g.uuid in placed.devices["nvidia.com/gpu"]}
    assert dgx.nodes_of_cpus(placed.cpus) == frozenset(gpu_nodes)
    assert placed.mems is None  # no Memory Manager: memory nodes left alone, as the kubelet does


def test_containers_of_one_pod_share_its_identity_and_a_name_is_held_once(ctx):
    book = fresh(ctx)
    sandbox = {"io.kubernetes.cri.sandbox-id": "sb", "io.kubernetes.cri.sandbox-uid": "uid-1",
               "io.kubernetes.cri.sandbox-name": "web", "io.kubernetes.cri.sandbox-namespace": "ns"}
    book.admit(container("c1", cpus=1, annotations={**sandbox,
                                                    "io.kubernetes.cri.container-name": "app"}))
    book.attach("c1", live(1))
    book.admit(container("c2", cpus=1, annotations={**sandbox,
                                                    "io.kubernetes.cri.container-name": "side"}))
    book.attach("c2", live(2))
    assert {r.pod_uid for r in book.containers.values()} == {"uid-1"}
    # A restart of "app" (new container id) replaces the old one rather than holding twice.
    book.admit(container("c3", cpus=1, annotations={**sandbox,
                                                    "io.kubernetes.cri.container-name": "app"}))
    assert sorted(book.containers) == ["c2", "c3"]


def test_pod_overrides_reach_the_engine_and_hook_annotations_do_not(ctx):
    book = fresh(ctx)
    loose = context(topologyManagerPolicy="restricted")
    placed = SharedLedger(loose, DeviceLocator(loose.topology)).admit(
        container("x", cpus=1, **{"numa.nri.io/hook": "true",
                                  "numa.nri.io/topology-policy": "single-numa-node"}))
    assert placed.exclusive
    with pytest.raises(Refused, match="InvalidAnnotation"):
        book.admit(container("y", cpus=1, **{"numa.nri.io/topology-policy": "none"}))


@pytest.mark.parametrize("raw, named", [
    ("x", "must be an object"),
    ({"pid": "1", "start": 1, "since": 0}, "pid must be"),
    ({"pid": 1, "start": None, "since": 0}, "go together"),
    ({"pid": None, "start": None, "cgroup": 5, "since": 0}, "cgroup"),
    ({"pid": None, "start": None, "since": "now"}, "since"),
])
def test_bad_process_entries_are_named(raw, named):
    with pytest.raises(RecordError, match=named):
        ProcessRecord.from_dict(raw, "processes['x']")


def test_the_schedulers_numa_nodes_are_honoured_and_a_bad_value_is_a_warning(ctx, caplog):
    """numa.nri.io/scheduled-numa-nodes reaches the hook where the runtime copies the pod's
    annotations into the container's spec (containerd's pod_annotations setting)."""
    node_1 = next(n.cpus for n in ctx.topology.numa_nodes if n.id == 1)
    book = fresh(ctx)
    chosen = book.admit(container("a", cpus=2, **{"numa.nri.io/scheduled-numa-nodes": "1"}))
    assert chosen.cpus <= node_1
    plain = book.admit(container("b", cpus=2, **{"numa.nri.io/scheduled-numa-nodes": "1-x"}))
    assert not plain.cpus & node_1  # as without the annotation: node 0 first
    [line] = [r.getMessage() for r in caplog.records if "scheduled-numa-nodes" in r.getMessage()]
    assert line == ("container b: annotation numa.nri.io/scheduled-numa-nodes: bad element "
                    "'1-x' in list '1-x'; ignored, the node decides alone")
    big = book.admit(container("c", cpus=len(node_1 & book.shared),
                               **{"numa.nri.io/scheduled-numa-nodes": "1"}))
    assert big.cpus <= node_1
    late = book.admit(container("d", cpus=2, **{"numa.nri.io/scheduled-numa-nodes": "1"}))
    assert not late.cpus & node_1
    [stale] = [r.getMessage() for r in caplog.records if "is stale" in r.getMessage()]
    assert stale.startswith("container d: the scheduler's choice of NUMA node 1 "
                            "(numa.nri.io/scheduled-numa-nodes) is stale, decided anew: ")
