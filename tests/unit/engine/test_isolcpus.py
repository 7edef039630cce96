"""Isolated CPUs (isolcpus): out of the shared pool, exclusive only for containers that ask."""

from dataclasses import replace

import pytest

from nri_numa.engine.admit import admit, release
from nri_numa.engine.allocations import AllocationsError
from nri_numa.engine.config import ConfigError
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.topology.synthetic import MachineSpec, build_topology

# Eight CPUs, one thread per core: node 0 holds 0-3, node 1 holds 4-7. CPU 0 is reserved.
ISOLATED = frozenset({2, 3, 7})


def context(isolcpus=ISOLATED, **config) -> EngineContext:
    machine = build_topology(MachineSpec(name="iso", sockets=1, nodes_per_socket=2,
                                         cores_per_node=4, threads_per_core=1, isolcpus=isolcpus))
    settings = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
                "topologyManagerPolicy": "single-numa-node", **config}
    return EngineContext.build(machine, config_from_mapping(settings))


def pod(name: str, cpus: int | None, annotations=None, containers=("main",)):
    resources = ({} if cpus is None else
                 {"limits": {"cpu": str(cpus), "memory": "1Gi"},
                  "requests": {"cpu": str(cpus), "memory": "1Gi"}})
    return pod_from_manifest({"metadata": {"name": name, "annotations": annotations or {}},
                              "spec": {"containers": [{"name": c, "resources": resources}
                                                      for c in containers]}})


def cpus_of(admission, container="main"):
    return next(p.cpus for p in admission.decision.placements if p.container == container)


def test_the_shared_pool_leaves_isolated_cpus_out():
    ctx = context()
    allocs = ctx.empty_allocations()
    assert allocs.shared == {0, 1, 4, 5, 6}
    best_effort = admit(ctx, allocs, pod("be", None))
    assert cpus_of(best_effort) == {0, 1, 4, 5, 6}
    assert best_effort.decision.shared_pool == {0, 1, 4, 5, 6}


def test_a_setting_lets_shared_containers_run_on_isolated_cpus():
    ctx = context(sharedPoolIncludesIsolcpus=True)
    assert ctx.empty_allocations().shared == set(range(8))
    # Exclusive CPUs still never come from them without the annotation.
    result = admit(ctx, ctx.empty_allocations(), pod("g", 3))
    assert cpus_of(result) == {4, 5, 6}


def test_without_the_annotation_exclusive_cpus_never_come_from_isolated_ones():
    ctx = context(topologyManagerPolicy="none")
    allocs = ctx.empty_allocations()
    first = admit(ctx, allocs, pod("a", 3))
    assert len(cpus_of(first)) == 3 and not cpus_of(first) & ISOLATED
    # One non-isolated CPU is left besides the reserved one: 2 more do not fit, though
    # three isolated CPUs are free.
    second = admit(ctx, first.allocations, pod("b", 2))
    assert second.decision.rejection is not None
    assert second.decision.rejection.reason == "UnexpectedAdmissionError"


def test_require_takes_isolated_cpus_on_the_hint_and_leaves_the_pool_alone():
    ctx = context()
    result = admit(ctx, ctx.empty_allocations(),
                   pod("r", 2, {"numa.nri.io/isolated-cpus": "require"}))
    assert result.decision.admitted
    assert cpus_of(result) == {2, 3}
    assert result.allocations.shared == {0, 1, 4, 5, 6}
    ctx.check(result.allocations)
    released = release(ctx, result.allocations, result.decision.pod)
    assert released.shared == {0, 1, 4, 5, 6}  # freed isolated CPUs stay out of the pool
    ctx.check(released)
    again = admit(ctx, released, pod("r2", 2, {"numa.nri.io/isolated-cpus": "require"}))
    assert cpus_of(again) == {2, 3}


def test_require_refuses_with_a_reason_when_too_few_isolated_cpus_are_free():
    ctx = context(topologyManagerPolicy="none")
    result = admit(ctx, ctx.empty_allocations(),
                   pod("r", 4, {"numa.nri.io/isolated-cpus": "require"}))
    rejection = result.decision.rejection
    assert rejection is not None and rejection.reason == "NotEnoughIsolatedCPUs"
    assert ("numa.nri.io/isolated-cpus is require: 4 exclusive isolated CPUs asked, 3 free "
            "(node 0: 2, node 1: 1)") in rejection.message
    assert result.allocations == ctx.empty_allocations()


def test_require_on_a_node_without_isolated_cpus_says_so():
    ctx = context(isolcpus=frozenset(), topologyManagerPolicy="none")
    result = admit(ctx, ctx.empty_allocations(),
                   pod("r", 1, {"numa.nri.io/isolated-cpus": "require"}))
    assert "this node has no isolated CPUs" in result.decision.rejection.message


def test_require_under_single_numa_node_refuses_when_no_node_has_enough():
    ctx = context()
    result = admit(ctx, ctx.empty_allocations(),
                   pod("r", 3, {"numa.nri.io/isolated-cpus": "require"}))
    rejection = result.decision.rejection
    assert rejection is not None
    assert rejection.reason == "TopologyAffinityError"  # 3 are free, on no one node
    assert "3 exclusive isolated CPUs" in rejection.message


def test_prefer_takes_isolated_cpus_first_then_others_on_the_same_node():
    ctx = context()
    result = admit(ctx, ctx.empty_allocations(),
                   pod("p", 3, {"numa.nri.io/isolated-cpus": "prefer"}))
    assert cpus_of(result) == {1, 2, 3}
    result = admit(ctx, ctx.empty_allocations(),
                   pod("p", 4, {"numa.nri.io/isolated-cpus": "prefer"}))
    assert cpus_of(result) == {4, 5, 6, 7}


def test_the_most_specific_annotation_wins():
    ctx = context(topologyManagerPolicy="none")
    annotations = {"numa.nri.io/isolated-cpus": "require",
                   "numa.nri.io/isolated-cpus.plain": "prefer"}
    both = pod("two", 1, annotations, containers=("iso", "plain"))
    plain = replace(both.app_containers[1], isolated_cpus=None)
    result = admit(ctx, ctx.empty_allocations(), replace(both, app_containers=(
        both.app_containers[0], plain)))
    assert cpus_of(result, "iso") <= ISOLATED
    assert cpus_of(result, "plain") <= ISOLATED  # prefer: isolated ones are free
    own = replace(both.app_containers[1], isolated_cpus="require")
    narrowed = replace(both, annotations={"numa.nri.io/isolated-cpus.plain": "prefer"},
                       app_containers=(replace(both.app_containers[0], cpu_request=1000), own))
    result = admit(ctx, ctx.empty_allocations(), narrowed)
    assert not cpus_of(result, "iso") & ISOLATED
    assert cpus_of(result, "plain") <= ISOLATED


@pytest.mark.parametrize("annotations, fragment", [
    ({"numa.nri.io/isolated-cpus": "yes"},
     "annotation numa.nri.io/isolated-cpus: 'yes' is not one of prefer, require"),
    ({"numa.nri.io/isolated-cpus.main": ""},
     "annotation numa.nri.io/isolated-cpus.main: '' is not one of prefer, require"),
])
def test_a_bad_value_is_refused_in_one_line(annotations, fragment):
    ctx = context()
    rejection = admit(ctx, ctx.empty_allocations(), pod("bad", 1, annotations)).decision.rejection
    assert rejection.reason == "InvalidAnnotation"
    assert fragment in rejection.message and "\n" not in rejection.message


def test_a_snapshot_with_isolated_cpus_in_the_shared_pool_is_refused():
    ctx = context()
    allocs = ctx.empty_allocations()
    with pytest.raises(AllocationsError, match=r"isolated CPUs 2-3,7 are in the shared pool"):
        ctx.check(allocs.with_shared(allocs.shared | ISOLATED))


def test_a_machine_whose_shared_cpus_are_all_isolated_is_a_config_error():
    with pytest.raises(ConfigError, match="every CPU left for the shared pool is isolated"):
        context(isolcpus=frozenset(range(8)), cpuManagerPolicy="none",
                reservedSystemCPUs="")
    assert context(isolcpus=frozenset(range(8)), cpuManagerPolicy="none", reservedSystemCPUs="",
                   sharedPoolIncludesIsolcpus=True).empty_allocations().shared == set(range(8))


def test_the_setting_must_be_a_flag():
    with pytest.raises(ConfigError, match="sharedPoolIncludesIsolcpus: must be true or false"):
        config_from_mapping({"sharedPoolIncludesIsolcpus": "yes"})
