"""The ledger: changed only by whole transactions, restored only when it fits the machine."""

from __future__ import annotations

import json

import pytest

from nri_numa.engine.admit import admit
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.manifest import container_from_resources
from nri_numa.engine.request import PodRequest
from nri_numa.state.ledger import LEDGER_VERSION, Ledger, LedgerError
from nri_numa.topology.cpulist import format_list, parse_list
from nri_numa.topology.synthetic import MachineSpec, MemorySpec, build_topology

GIB = 1 << 30
# 2 sockets × 1 node × 4 cores × 2 threads: node 0 = CPUs 0-3,8-11, node 1 = 4-7,12-15.
MACHINE = build_topology(MachineSpec("ledger", sockets=2, nodes_per_socket=1, cores_per_node=4,
                                     memory=MemorySpec(8 * GIB)))


def engine(**more) -> EngineContext:
    config = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,8",
              "topologyManagerPolicy": "single-numa-node", "memoryManagerPolicy": "Static",
              "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}], **more}
    return EngineContext.build(MACHINE, config_from_mapping(config))


def guaranteed(uid: str, cpu: str, memory: str = "1Gi", **annotations: str) -> PodRequest:
    main = container_from_resources("main", "app", {}, {"cpu": cpu, "memory": memory})
    return PodRequest(uid=uid, namespace="default", name=uid, app_containers=(main,),
                      annotations=annotations)


def test_a_new_ledger_starts_empty():
    ctx = engine()
    assert Ledger(ctx).allocations == ctx.empty_allocations()


def test_an_admission_is_committed_whole():
    ledger = Ledger(engine())
    result = ledger.admit(guaranteed("a", "4", "2Gi"))
    assert result.decision.admitted
    assert ledger.allocations is result.allocations
    assert ledger.allocations.container("a", "main").exclusive_cpus


def test_a_refusal_leaves_the_ledger_untouched():
    ledger = Ledger(engine())
    ledger.admit(guaranteed("a", "4"))
    before, before_dict = ledger.allocations, ledger.to_dict()
    for refused in (guaranteed("too-big", "9"),  # no node has 9 CPUs
                    guaranteed("too-much-memory", "1", "20Gi"),
                    guaranteed("bad", "1", **{"numa.nri.io/topology-policy": "none"})):
        result = ledger.admit(refused)
        assert not result.decision.admitted
        assert ledger.allocations is before
    assert ledger.to_dict() == before_dict


def test_a_pod_refused_halfway_keeps_none_of_its_containers():
    ledger = Ledger(engine())
    first = container_from_resources("first", "app", {}, {"cpu": "2", "memory": "1Gi"})
    second = container_from_resources("second", "app", {}, {"cpu": "9", "memory": "1Gi"})
    before = ledger.allocations
    result = ledger.admit(PodRequest(uid="p", namespace="default", name="p",
                                     app_containers=(first, second)))
    assert result.decision.rejection.container == "second"
    assert ledger.allocations is before and "p" not in ledger.allocations.pods


def test_an_exception_in_the_engine_leaves_the_ledger_untouched():
    ledger = Ledger(engine())
    ledger.admit(guaranteed("a", "2"))
    before = ledger.allocations
    with pytest.raises(ValueError, match="no container named ghost"):
        ledger.admit(guaranteed("b", "2"), ["ghost"])
    assert ledger.allocations is before


def test_release_commits_the_release():
    ctx = engine()
    ledger = Ledger(ctx)
    ledger.admit(guaranteed("a", "2"))
    ledger.admit(guaranteed("b", "2"))
    after = ledger.release("a")
    assert ledger.allocations is after and list(after.pods) == ["b"]
    ledger.release("b", "main")
    assert ledger.allocations == ctx.empty_allocations()
    assert ledger.release("nobody") is ledger.allocations


def test_admit_on_the_ledger_matches_admit_on_its_snapshot():
    ledger = Ledger(engine())
    ledger.admit(guaranteed("a", "2"))
    expected = admit(ledger.ctx, ledger.allocations, guaranteed("b", "3"))
    assert ledger.admit(guaranteed("b", "3")) == expected


# --- snapshots -----------------------------------------------------------------------------------

def filled() -> Ledger:
    ledger = Ledger(engine())
    for uid, cpu, memory in (("a", "2", "2Gi"), ("b", "500m", "1Gi"), ("c", "3", "4Gi")):
        assert ledger.admit(guaranteed(uid, cpu, memory)).decision.admitted
    return ledger


def test_restore_gives_back_the_same_ledger():
    ledger = filled()
    data = json.loads(json.dumps(ledger.to_dict()))
    assert data["version"] == LEDGER_VERSION
    restored = Ledger.restore(ledger.ctx, data)
    assert restored.allocations == ledger.allocations
    assert restored.to_dict() == ledger.to_dict()
    # The restored ledger places the next pod exactly where the original does.
    assert restored.admit(guaranteed("d", "2")) == ledger.admit(guaranteed("d", "2"))


@pytest.mark.parametrize("data", [{"allocations": {}}, {"version": 2, "allocations": {}},
                                  {"version": "1"}, [], None])
def test_a_version_it_does_not_read_is_refused(data):
    with pytest.raises(LedgerError) as error:
        Ledger.restore(engine(), data)
    assert str(error.value).startswith("ledger version is ")
    assert str(error.value).endswith(f"this nri-numa reads {LEDGER_VERSION}")


def corrupt(change) -> dict:
    data = json.loads(json.dumps(filled().to_dict()))
    change(data["allocations"])
    return data


def _overlap(a: dict) -> None:
    a["pods"]["c"]["containers"]["main"]["exclusive_cpus"] = \
        a["pods"]["a"]["containers"]["main"]["exclusive_cpus"]


def _lost_cpu(a: dict) -> None:
    shared = parse_list(a["shared"])
    a["shared"] = format_list(shared - {max(shared)})


def _memory_mismatch(a: dict) -> None:
    # Consistent on its own (free + reserved = allocatable), but no block accounts for it.
    table = a["memory"]["machineState"]["1"]["memoryMap"]["memory"]
    table["free"] -= GIB
    table["reserved"] += GIB


def _bad_field(a: dict) -> None:
    a["pods"]["a"]["containers"]["main"]["exclusive_cpus"] = 7


@pytest.mark.parametrize(("change", "message"), [
    (_overlap, "is exclusive to both pod a and pod c"),
    (_lost_cpu, "shared pool and exclusive CPUs do not cover the CPUs exactly; missing"),
    (_memory_mismatch, "the expected machine state is different from the real one"),
    (_bad_field, 'pods.a.containers.main.exclusive_cpus must be a CPU list such as "0-3"'),
], ids=["two pods on one CPU", "a CPU lost", "memory does not add up", "a malformed field"])
def test_restore_checks_the_invariants(change, message):
    with pytest.raises(LedgerError) as error:
        Ledger.restore(engine(), corrupt(change))
    assert str(error.value).startswith("ledger does not fit this machine: ")
    assert message in str(error.value)


def test_a_snapshot_from_another_configuration_is_refused():
    data = json.loads(json.dumps(filled().to_dict()))
    strict = engine(cpuManagerPolicyOptions={"strict-cpu-reservation": "true"})
    with pytest.raises(LedgerError, match="unexpected 0,8"):
        Ledger.restore(strict, data)
