"""Which containers are degraded (nri_numa.nri.promotion), derived from the records alone, and
their promotion: oldest first, committed only when admitted, the ledger untouched otherwise."""

from __future__ import annotations

import logging

import pytest

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.manifest import container_from_resources
from nri_numa.engine.request import ContainerRequest
from nri_numa.nri import promotion
from nri_numa.state.ledger import Ledger
from nri_numa.state.plugin_records import PodRecord, Records
from nri_numa.topology.cpulist import format_list
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import CONFIG, machine

GUARANTEED_2 = container_from_resources("app", "app", {"cpu": "2", "memory": "1Gi"},
                                        {"cpu": "2", "memory": "1Gi"})
GUARANTEED_HALF = container_from_resources("app", "app", {"cpu": "500m", "memory": "1Gi"},
                                           {"cpu": "500m", "memory": "1Gi"})
BURSTABLE = container_from_resources("app", "app", {"cpu": "1"}, {})
STATIC_MEMORY = {"memoryManagerPolicy": "Static",
                 "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}},
                                    {"numaNode": 1, "limits": {"memory": "1Gi"}}]}


def records(**config) -> Records:
    return Records(Ledger(EngineContext.build(machine(), config_from_mapping({**CONFIG,
                                                                               **config}))))


def unplaced(r: Records, name: str, request: ContainerRequest, qos: str = "guaranteed",
             parent: str | None = None) -> str:
    """A running container recorded without a placement, as sync.adopt records one that does
    not fit; its id."""
    pod = r.pod(PodRecord(f"sb-{name}", f"uid-{name}", "default", name,
                          msg.cgroup_parent(f"uid-{name}", qos) if parent is None else parent))
    r.remember_unplaced(f"ctr-{name}", pod, request)
    return f"ctr-{name}"


@pytest.mark.parametrize(("config", "request_", "qos", "wanted"), [
    ({}, GUARANTEED_2, "guaranteed", True),  # exclusive CPUs
    ({}, GUARANTEED_HALF, "guaranteed", False),  # a fraction: the shared pool is its place
    ({}, BURSTABLE, "burstable", False),
    ({"cpuManagerPolicy": "none", "reservedSystemCPUs": ""}, GUARANTEED_2, "guaranteed", False),
    (STATIC_MEMORY, GUARANTEED_HALF, "guaranteed", True),  # memory nodes
    (STATIC_MEMORY, BURSTABLE, "burstable", False),
])
def test_degraded_means_the_kubelet_would_pin_it(config, request_, qos, wanted):
    r = records(**config)
    cid = unplaced(r, "x", request_, qos)
    assert [c.id for c in promotion.degraded(r)] == ([cid] if wanted else [])


def test_the_class_comes_from_the_cgroup_parent_or_else_the_resources():
    r = records()
    systemd = unplaced(r, "s", GUARANTEED_2,
                       parent=msg.cgroup_parent("uid-s", "guaranteed", "systemd"))
    outside = unplaced(r, "o", GUARANTEED_2, parent="/machine.slice")  # request = limit
    told_burstable = unplaced(r, "b", GUARANTEED_2, "burstable")  # the kubelet said so
    assert [c.id for c in promotion.degraded(r)] == [systemd, outside]
    assert told_burstable in r.containers.unplaced_ids


def test_promotion_takes_the_oldest_first_and_leaves_the_rest_as_they_were():
    r = records()
    # Fill node 1 (4-7) and two of node 0's 1-3: one exclusive CPU is left.
    for uid, cpus in (("n1", "4"), ("n0", "2")):
        pod = r.pod(PodRecord(f"sb-{uid}", uid, "default", uid, msg.cgroup_parent(uid,
                                                                                  "guaranteed")))
        request = container_from_resources("app", "app", {"cpu": cpus, "memory": "1Gi"},
                                           {"cpu": cpus, "memory": "1Gi"})
        result = r.ledger.admit(promotion.pod_request(r, pod, request), ["app"])
        r.remember(f"ctr-{uid}", pod, request, result.decision.placements[0])
    one = container_from_resources("app", "app", {"cpu": "1", "memory": "1Gi"},
                                   {"cpu": "1", "memory": "1Gi"})
    first, second = unplaced(r, "first", one), unplaced(r, "second", one)
    before = r.ledger.allocations
    done = promotion.promote(r)
    assert [p.record.id for p in done] == [first]
    left = {1, 2, 3} - r.containers["ctr-n0"].cpus
    assert done[0].placement.cpus == left and r.containers[first].in_ledger
    assert r.containers[second] is not None and not r.containers[second].in_ledger
    assert r.ledger.allocations.container("uid-second", "app") is None
    assert r.ledger.allocations is not before and r.shared == {0}
    assert [c.id for c in promotion.degraded(r)] == [second]
    # Nothing left to give: a second pass changes nothing.
    after = r.ledger.allocations
    assert promotion.promote(r) == [] and r.ledger.allocations is after


def test_a_promotion_line_is_the_placed_line_with_its_own_event(caplog):
    r = records()
    cid = unplaced(r, "x", GUARANTEED_2)
    with caplog.at_level(logging.INFO):
        [done] = promotion.promote(r)
    [line] = caplog.records
    assert line.getMessage().startswith("promoted pod default/x container app: ")
    assert (line.event, line.container_id, line.exclusive) == ("promoted", cid, True)
    assert line.cpus == format_list(done.placement.cpus)
