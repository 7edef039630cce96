"""Per-pod annotations may narrow the node's topology policy and scope, never widen them."""

from __future__ import annotations

import pytest

from nri_numa.engine.annotations import (PREFIX, TOPOLOGY_POLICY, TOPOLOGY_SCOPE,
                                         AnnotationError, PodTopology, pod_topology)
from nri_numa.engine.config import EngineConfig, TopologyPolicy, TopologyScope

POLICIES = [p.value for p in TopologyPolicy]


def node(policy: str = "none", scope: str = "container", **kwargs) -> EngineConfig:
    return EngineConfig(topology_manager_policy=policy, topology_manager_scope=scope, **kwargs)


def test_no_annotations_keeps_the_node_settings():
    assert pod_topology(node("restricted", "pod"), {}) == PodTopology(
        TopologyPolicy.RESTRICTED, TopologyScope.POD, ())
    # Other annotations are none of our business.
    assert pod_topology(node(), {"prometheus.io/scrape": "true"}).overridden == ()


@pytest.mark.parametrize("node_policy", POLICIES)
@pytest.mark.parametrize("asked", POLICIES)
def test_policy_may_only_get_stricter(node_policy, asked):
    config = node(node_policy)
    if POLICIES.index(asked) >= POLICIES.index(node_policy):
        result = pod_topology(config, {TOPOLOGY_POLICY: asked})
        assert result.policy == asked
        assert result.overridden == ((TOPOLOGY_POLICY,) if asked != node_policy else ())
    else:
        with pytest.raises(AnnotationError) as e:
            pod_topology(config, {TOPOLOGY_POLICY: asked})
        assert (f'annotation {TOPOLOGY_POLICY}: "{asked}" is looser than this node\'s '
                f'topologyManagerPolicy "{node_policy}"') in str(e.value)
        allowed = ", ".join(POLICIES[POLICIES.index(node_policy):])
        assert str(e.value).endswith(f"a pod may only narrow it: {allowed}")


def test_scope_may_only_get_stricter():
    assert pod_topology(node(scope="container"), {TOPOLOGY_SCOPE: "pod"}) == PodTopology(
        TopologyPolicy.NONE, TopologyScope.POD, (TOPOLOGY_SCOPE,))
    assert pod_topology(node(scope="pod"), {TOPOLOGY_SCOPE: "pod"}).overridden == ()
    with pytest.raises(AnnotationError, match='"container" is looser than this node\'s '
                                              'topologyManagerScope "pod"'):
        pod_topology(node(scope="pod"), {TOPOLOGY_SCOPE: "container"})


def test_both_overrides_together():
    result = pod_topology(node("best-effort"), {TOPOLOGY_POLICY: "single-numa-node",
                                                TOPOLOGY_SCOPE: "pod"})
    assert result == PodTopology(TopologyPolicy.SINGLE_NUMA_NODE, TopologyScope.POD,
                                 (TOPOLOGY_POLICY, TOPOLOGY_SCOPE))


@pytest.mark.parametrize("name, value, fragment", [
    (TOPOLOGY_POLICY, "strict", '"strict" is not one of none, best-effort, restricted, '
                                "single-numa-node; this node allows restricted, single-numa-node"),
    (TOPOLOGY_POLICY, "Restricted", '"Restricted" is not one of'),
    (TOPOLOGY_POLICY, "", '"" is not one of'),
    (TOPOLOGY_SCOPE, "node", '"node" is not one of container, pod'),
])
def test_bad_values_name_annotation_value_and_allowed(name, value, fragment):
    with pytest.raises(AnnotationError) as e:
        pod_topology(node("restricted"), {name: value})
    assert str(e.value).startswith(f"annotation {name}: ")
    assert fragment in str(e.value)


def test_unknown_names_under_the_prefix_are_errors():
    with pytest.raises(AnnotationError) as e:
        pod_topology(node(), {PREFIX + "topology-polcy": "restricted"})
    assert str(e.value) == (f"annotation {PREFIX}topology-polcy: unknown; annotations under "
                            f"{PREFIX} are {PREFIX}devices, {PREFIX}devices.<container>, "
                            f"{PREFIX}isolated-cpus, {PREFIX}isolated-cpus.<container>, "
                            f"{PREFIX}retry-for-room, {PREFIX}scheduled-numa-nodes, "
                            f"{TOPOLOGY_POLICY}, {TOPOLOGY_SCOPE}")


@pytest.mark.parametrize("name", [PREFIX + "devices", PREFIX + "devices.main"])
def test_device_requests_are_known_names_and_not_overrides(name):
    config = node("restricted", allow_pod_overrides=False)
    assert pod_topology(config, {name: "nvidia.com/gpu=1"}).overridden == ()
    with pytest.raises(AnnotationError, match="devices.: unknown"):
        pod_topology(config, {PREFIX + "devices.": "x=1"})  # no container name


def test_other_parts_may_declare_their_own_names():
    devices = PREFIX + "align-devices"
    result = pod_topology(node(), {devices: "nvidia.com/gpu"}, other_known=[devices])
    assert result.overridden == ()
    with pytest.raises(AnnotationError, match=f"are {devices}, {PREFIX}devices, "):
        pod_topology(node(), {PREFIX + "typo": "x"}, other_known=[devices])


def test_node_may_forbid_overrides():
    config = node("restricted", allow_pod_overrides=False)
    assert pod_topology(config, {}).policy is TopologyPolicy.RESTRICTED
    with pytest.raises(AnnotationError) as e:
        pod_topology(config, {TOPOLOGY_POLICY: "single-numa-node"})
    assert str(e.value).startswith(f"annotation {TOPOLOGY_POLICY}: pod overrides are disabled on "
                                   "this node (allowPodOverrides: false)")
    # Even an annotation that would change nothing is refused: the pod relies on something
    # this node does not offer.
    with pytest.raises(AnnotationError, match="disabled"):
        pod_topology(config, {TOPOLOGY_SCOPE: "container"})


def test_single_numa_node_override_conflicts_with_align_by_socket():
    config = EngineConfig(topology_manager_policy="restricted", cpu_manager_policy="static",
                          reserved_system_cpus={0},
                          cpu_manager_policy_options={"align-by-socket": "true"})
    with pytest.raises(AnnotationError, match="align-by-socket"):
        pod_topology(config, {TOPOLOGY_POLICY: "single-numa-node"})
    kept = pod_topology(config, {TOPOLOGY_POLICY: "restricted"})
    assert kept.policy is TopologyPolicy.RESTRICTED
