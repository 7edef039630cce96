"""Per-pod overrides, as pod annotations under one prefix: ``numa.nri.io/``.

A pod may *narrow* what the node's configuration gives it, never widen it:

* ``numa.nri.io/topology-policy``: ``none`` < ``best-effort`` < ``restricted`` <
  ``single-numa-node``; the pod may name the node's policy or a stricter one.
* ``numa.nri.io/topology-scope``: ``container`` < ``pod``; pod scope is the stricter, since it
  aligns every container of the pod together.

A looser value is an error, not silently ignored: the pod asked for something it will not get.
The node may forbid overrides altogether (``allowPodOverrides: false``); a pod that carries one
there gets an error too. Unknown names under the prefix are errors as well, so that a typo is
not mistaken for "no override"; parts that add annotations of their own under the prefix pass
their names in ``other_known``.

Devices are asked for under the same prefix (docs/devices.md): ``numa.nri.io/devices.<container>``
on the pod, or ``numa.nri.io/devices`` on the container itself; they are requests, not overrides,
so ``allowPodOverrides`` does not gate them. Their values are read by
``nri_numa.engine.devices.requested``.

Isolated CPUs (the kernel's ``isolcpus``) are asked for the same way: ``numa.nri.io/isolated-cpus``
on the pod (every container of it), ``numa.nri.io/isolated-cpus.<container>`` on the pod, or
``numa.nri.io/isolated-cpus`` on the container itself (the most specific one wins); the value is
``prefer`` or ``require`` (docs/annotations.md). A request too, not gated by ``allowPodOverrides``.

``numa.nri.io/scheduled-numa-nodes`` is written by the scheduler extender at bind: the NUMA nodes
its run of the engine chose. It is a preference, not an override: ``scheduled_numa_nodes`` reads
it for the front doors, which hand it to the engine as ``PodRequest.preferred_numa``; a value
that cannot be read is ignored with a warning there, never a refusal (the scheduler's note must
not stop a pod), so ``pod_topology`` only accepts the name. ``numa.nri.io/retry-for-room``, also
the extender's, only makes kube-scheduler look at the pod again; nothing here reads its value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from nri_numa.engine.config import EngineConfig, Ranked, TopologyPolicy, TopologyScope
from nri_numa.safeio.bounds import MAX_ANNOTATION_VALUE, clip, quote
from nri_numa.topology.cpulist import ListFormatError, format_list, parse_list

R = TypeVar("R", bound=Ranked)

PREFIX = "numa.nri.io/"
TOPOLOGY_POLICY = PREFIX + "topology-policy"
TOPOLOGY_SCOPE = PREFIX + "topology-scope"
OVERRIDES = (TOPOLOGY_POLICY, TOPOLOGY_SCOPE)
DEVICES = PREFIX + "devices"  # on a container: the devices it asks for
DEVICES_FOR = DEVICES + "."  # + a container name, on the pod: what that container asks for
ISOLATED_CPUS = PREFIX + "isolated-cpus"  # on a pod or a container: prefer or require isolcpus
ISOLATED_CPUS_FOR = ISOLATED_CPUS + "."  # + a container name, on the pod
ISOLATED_CPUS_MODES = ("prefer", "require")
SCHEDULED_NUMA_NODES = PREFIX + "scheduled-numa-nodes"  # on a pod: written by the extender
# On a pod: written by the extender to have kube-scheduler retry it; admission never reads it.
RETRY_FOR_ROOM = PREFIX + "retry-for-room"
WRITTEN_BY_THE_EXTENDER = (SCHEDULED_NUMA_NODES, RETRY_FOR_ROOM)
# A NUMA list longer than this is not a scheduler's note: 64 two-digit ids as single items fit.
MAX_SCHEDULED_NUMA_TEXT = 256


class AnnotationError(ValueError):
    """A pod annotation that cannot be honoured; the message names it, its value and what is
    allowed."""


@dataclass(frozen=True, slots=True)
class PodTopology:
    """The topology policy and scope that apply to one pod."""

    policy: TopologyPolicy
    scope: TopologyScope
    overridden: tuple[str, ...] = ()  # annotations that changed policy or scope, for explain


def pod_topology(config: EngineConfig, annotations: Mapping[str, str], *,
                 other_known: Iterable[str] = ()) -> PodTopology:
    """The node's policy and scope, narrowed by the pod's annotations; raises AnnotationError."""
    ours = {k: v for k, v in annotations.items() if k.startswith(PREFIX)}
    _check_names(ours, frozenset(OVERRIDES) | frozenset(other_known))
    check_values({k: v for k, v in ours.items() if k != SCHEDULED_NUMA_NODES})
    asked = [name for name in OVERRIDES if name in ours]
    if asked and not config.allow_pod_overrides:
        raise AnnotationError(f"annotation {asked[0]}: pod overrides are disabled on this node "
                              "(allowPodOverrides: false); remove the annotation")
    policy = _narrowed(ours, TOPOLOGY_POLICY, config.topology_manager_policy,
                       "topologyManagerPolicy")
    scope = _narrowed(ours, TOPOLOGY_SCOPE, config.topology_manager_scope,
                      "topologyManagerScope")
    if (policy is not config.topology_manager_policy
            and policy is TopologyPolicy.SINGLE_NUMA_NODE and config.cpu_options.align_by_socket):
        raise AnnotationError(f'annotation {TOPOLOGY_POLICY}: "{policy}" cannot be used on this '
                              "node: its cpuManagerPolicyOptions turn on align-by-socket, which "
                              "the single-numa-node policy is incompatible with")
    overridden = tuple(name for name, node_value, value in (
        (TOPOLOGY_POLICY, config.topology_manager_policy, policy),
        (TOPOLOGY_SCOPE, config.topology_manager_scope, scope)) if value is not node_value)
    return PodTopology(policy=policy, scope=scope, overridden=overridden)


def scheduled_numa_nodes(annotations: Mapping[str, str],
                         machine_nodes: Iterable[int]) -> frozenset[int] | None:
    """The NUMA nodes the scheduler extender chose for the pod (``numa.nri.io/scheduled-numa-nodes``),
    or None without the annotation. AnnotationError, naming the value, for one that is not a
    list of this machine's NUMA node ids; the caller ignores the annotation then."""
    raw = annotations.get(SCHEDULED_NUMA_NODES)
    if raw is None:
        return None
    where = f"annotation {SCHEDULED_NUMA_NODES}"
    if not isinstance(raw, str) or len(raw) > MAX_SCHEDULED_NUMA_TEXT:
        raise AnnotationError(f"{where}: the value {quote(raw)} is not a NUMA node list of at "
                              f"most {MAX_SCHEDULED_NUMA_TEXT} characters")
    try:
        nodes = parse_list(raw)
    except ListFormatError as e:
        raise AnnotationError(f"{where}: {e}") from None
    if not nodes:
        raise AnnotationError(f"{where}: the value {quote(raw)} names no NUMA node")
    unknown = nodes - frozenset(machine_nodes)
    if unknown:
        raise AnnotationError(f"{where}: NUMA node {format_list(unknown)} of {quote(raw)} is not "
                              "on this machine")
    return nodes


def is_device_annotation(name: str) -> bool:
    """``numa.nri.io/devices`` or ``numa.nri.io/devices.<container>``."""
    return name == DEVICES or (name.startswith(DEVICES_FOR) and len(name) > len(DEVICES_FOR))


def is_isolated_cpus_annotation(name: str) -> bool:
    """``numa.nri.io/isolated-cpus`` or ``numa.nri.io/isolated-cpus.<container>``."""
    return name == ISOLATED_CPUS or (name.startswith(ISOLATED_CPUS_FOR)
                                     and len(name) > len(ISOLATED_CPUS_FOR))


def isolated_cpus_mode(pod_annotations: Mapping[str, str], container: str,
                       own: str | None = None) -> str | None:
    """``prefer``, ``require`` or None (no isolated CPUs) for one container: its own
    annotation's value ``own``, else the pod's for that container, else the pod's for all of
    them. AnnotationError for a value that is neither."""
    for name, value in ((ISOLATED_CPUS, own),
                        (ISOLATED_CPUS_FOR + container, pod_annotations.get(ISOLATED_CPUS_FOR + container)),
                        (ISOLATED_CPUS, pod_annotations.get(ISOLATED_CPUS))):
        if value is None:
            continue
        if value not in ISOLATED_CPUS_MODES:
            raise AnnotationError(f"annotation {name}: {quote(value)} is not one of "
                                  f"{', '.join(ISOLATED_CPUS_MODES)}")
        return value
    return None


def check_values(ours: Mapping[str, object]) -> None:
    """AnnotationError for a value of one of ours that is not a string or is longer than
    MAX_ANNOTATION_VALUE: nothing under the prefix needs more, and it is refused before it is
    parsed."""
    for name, value in ours.items():
        if not isinstance(value, str):
            raise AnnotationError(f"annotation {clip(name)}: the value must be a string, not "
                                  f"{quote(value)}")
        if len(value) > MAX_ANNOTATION_VALUE:
            raise AnnotationError(f"annotation {clip(name)}: the value {quote(value)} is longer "
                                  f"than {MAX_ANNOTATION_VALUE} characters")


def _check_names(ours: Mapping[str, str], known: frozenset[str]) -> None:
    for name in sorted(ours):
        if (name not in known and name not in WRITTEN_BY_THE_EXTENDER
                and not is_device_annotation(name) and not is_isolated_cpus_annotation(name)):
            names = sorted(known | {DEVICES, DEVICES_FOR + "<container>", ISOLATED_CPUS,
                                    ISOLATED_CPUS_FOR + "<container>", *WRITTEN_BY_THE_EXTENDER})
            raise AnnotationError(f"annotation {clip(name, 80)}: unknown; annotations under "
                                  f"{PREFIX} are {', '.join(names)}")


def _narrowed(ours: Mapping[str, str], name: str, node_value: R, key: str) -> R:
    raw = ours.get(name)
    if raw is None:
        return node_value
    kind = type(node_value)
    allowed = [v.value for v in kind if v.strictness >= node_value.strictness]
    if raw not in {v.value for v in kind}:
        raise AnnotationError(f'annotation {name}: "{clip(raw)}" is not one of '
                              f"{', '.join(v.value for v in kind)}; this node allows "
                              f"{', '.join(allowed)}")
    value = kind(raw)
    if value.strictness < node_value.strictness:
        raise AnnotationError(f'annotation {name}: "{raw}" is looser than this node\'s {key} '
                              f'"{node_value}"; a pod may only narrow it: {", ".join(allowed)}')
    return value
