"""What a node publishes so that a scheduler can replay its admission exactly.

The NodeResourceTopology object says how much is free in each NUMA zone; that is not enough to
predict the node's decision (CPU packing, SMT, L3 groups, reserved CPUs, device links, init
containers' CPUs reused). So the node publishes, next to it, everything its engine decides from:
the machine (the ``nri-numa topology --json`` form), the engine configuration (as the
KubeletConfiguration keys that affect placement) and the ledger (the allocations in the state
package's encoding). The three go as one annotation, ``numa.nri.io/node-state``, on the NRT
object: ``v1:`` then base64 of zlib of the canonical JSON. An annotation rather than a CRD of our
own: it is written in the same request as the zone counts, so a reader never sees one without
the other, and it needs no second object, watch or RBAC rule; compressed, the biggest preset
with a full ledger stays well under the 256 KiB that Kubernetes allows all of an object's
annotations together (docs/scheduler-extender.md has the sizes).

``decode`` is strict and bounded: the text's length, the inflated size and the JSON's shape are
checked before anything is built, and any problem is one ``NodeStateError`` line.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nri_numa.engine.allocations import Allocations, AllocationsError
from nri_numa.engine.config import ConfigError, EngineConfig
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.memory.state import MemoryStateError
from nri_numa.engine.quantity import format_millicores
from nri_numa.safeio.bounded_json import JsonShapeError, loads
from nri_numa.state.encoding import canonical
from nri_numa.topology.cpulist import format_list
from nri_numa.topology.model import Topology, TopologyFormatError

ANNOTATION = "numa.nri.io/node-state"
PREFIX = "v1:"
MAX_TEXT = 256 * 1024  # characters: all of an object's annotations together may not be more
MAX_INFLATED = 32 * 1024 * 1024  # bytes of JSON a published state may inflate to


class NodeStateError(ValueError):
    """A published state that cannot be read; the message is one line."""


@dataclass(frozen=True, slots=True)
class NodeState:
    topology: Topology
    config: EngineConfig
    allocations: Allocations
    generation: int  # the node's count of committed ledger changes: newer states have more


def config_to_mapping(config: EngineConfig) -> dict[str, Any]:
    """The KubeletConfiguration keys (and nri-numa's own) that ``config_from_mapping`` reads
    back into an equal EngineConfig."""
    def amounts(reserved: Mapping[str, int]) -> dict[str, str]:
        return {r: format_millicores(n) if r == "cpu" else str(n) for r, n in reserved.items()}

    mapping: dict[str, Any] = {
        "topologyManagerPolicy": str(config.topology_manager_policy),
        "topologyManagerScope": str(config.topology_manager_scope),
        "topologyManagerPolicyOptions": dict(config.topology_manager_policy_options),
        "cpuManagerPolicy": str(config.cpu_manager_policy),
        "cpuManagerPolicyOptions": dict(config.cpu_manager_policy_options),
        "kubeReserved": amounts(config.kube_reserved),
        "systemReserved": amounts(config.system_reserved),
        "memoryManagerPolicy": str(config.memory_manager_policy),
        "reservedMemory": [{"numaNode": r.numa_node,
                            "limits": {k: str(v) for k, v in r.limits.items()}}
                           for r in config.reserved_memory],
        "allowPodOverrides": config.allow_pod_overrides,
        "sharedPoolIncludesIsolcpus": config.shared_pool_includes_isolcpus,
        "cpuManagerReconcilePeriod": config.cpu_manager_reconcile_period,
    }
    if config.reserved_system_cpus:
        mapping["reservedSystemCPUs"] = format_list(config.reserved_system_cpus)
    return mapping


def encode(topology: Topology, config: EngineConfig, allocations: Allocations,
           generation: int) -> str:
    """The annotation's value. Deterministic: equal states give equal text, so an unchanged
    node never rewrites its object."""
    document = {"topology": topology.to_dict(), "config": config_to_mapping(config),
                "allocations": allocations.to_dict(), "generation": generation}
    packed = zlib.compress(canonical(document), 9)
    return PREFIX + base64.b64encode(packed).decode("ascii")


def decode(text: Any) -> NodeState:
    if not isinstance(text, str):
        raise NodeStateError(f"{ANNOTATION}: must be a string, not {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise NodeStateError(f"{ANNOTATION}: {len(text)} characters, more than {MAX_TEXT}")
    if not text.startswith(PREFIX):
        head = text.split(":", 1)[0][:16] if ":" in text else "none"
        raise NodeStateError(f"{ANNOTATION}: version {head!r} is not {PREFIX[:-1]!r} "
                             "(a newer nri-numa on the node?)")
    try:
        packed = base64.b64decode(text[len(PREFIX):], validate=True)
    except (binascii.Error, ValueError) as e:
        raise NodeStateError(f"{ANNOTATION}: not base64: {e}") from None
    raw = _inflate(packed)
    try:  # the byte scan, not the tree walk: an extender decodes every node's every change
        document = loads(raw)
    except JsonShapeError as e:
        raise NodeStateError(f"{ANNOTATION}: {e}") from None
    return _state(document)


def _inflate(packed: bytes) -> bytes:
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(packed, MAX_INFLATED)
    except zlib.error as e:
        raise NodeStateError(f"{ANNOTATION}: not zlib data: {e}") from None
    if inflater.unconsumed_tail:
        raise NodeStateError(f"{ANNOTATION}: inflates to more than {MAX_INFLATED} bytes")
    if not inflater.eof:
        raise NodeStateError(f"{ANNOTATION}: zlib data cut short")
    return raw


def _state(document: Any) -> NodeState:
    if not isinstance(document, dict):
        raise NodeStateError(f"{ANNOTATION}: must hold an object, not {type(document).__name__}")
    missing = {"topology", "config", "allocations", "generation"} - set(document)
    if missing:
        raise NodeStateError(f"{ANNOTATION}: has no {', '.join(sorted(missing))}")
    generation = document["generation"]
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise NodeStateError(f"{ANNOTATION}: generation must be a count (0 or more), "
                             f"not {str(generation)[:40]!r}")
    try:
        topology = Topology.from_dict(document["topology"])
    except (TopologyFormatError, ValueError) as e:
        raise NodeStateError(f"{ANNOTATION}: topology: {_line(e)}") from None
    try:
        config = config_from_mapping(document["config"])
    except ConfigError as e:
        raise NodeStateError(f"{ANNOTATION}: config: {_line(e)}") from None
    try:
        allocations = Allocations.from_dict(document["allocations"])
    except (AllocationsError, MemoryStateError, ValueError) as e:
        raise NodeStateError(f"{ANNOTATION}: allocations: {_line(e)}") from None
    return NodeState(topology, config, allocations, generation)


def _line(e: Exception) -> str:
    return " ".join(str(e).split())[:400]
