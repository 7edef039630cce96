"""The configuration a checkpoint's placements were made under, and the rule about changing it.

The kubelet keeps its CPU Manager policy's name in ``cpu_manager_state`` (and the Memory
Manager's in ``memory_manager_state``) and refuses to start when the configured policy differs
("configured policy ... differs from state checkpoint policy ... please drain node and remove
policy state file"): containers placed under one policy would keep CPUs, memory or a shared
pool the new one knows nothing about. The plugin records the same things in its checkpoint
(payload member ``config``) — topology, CPU and memory manager policies and the reserved CPUs —
and applies the same rule, only while the checkpoint still holds containers: with none, the
new configuration simply starts from an empty ledger.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nri_numa.state.checkpoint import CheckpointError, CheckpointStore
from nri_numa.state.plugin_records import RecordError
from nri_numa.topology.cpulist import ListFormatError, format_list, parse_list

log = logging.getLogger(__name__)

PAYLOAD_KEY = "config"


class ConfigChangedError(CheckpointError):
    """The configuration changed while the checkpoint holds containers; the message says how
    to drain."""


@dataclass(frozen=True, slots=True)
class RecordedConfig:
    topology_manager_policy: str
    cpu_manager_policy: str
    memory_manager_policy: str
    reserved_cpus: frozenset[int]

    @classmethod
    def of(cls, config: Any, reserved_cpus: frozenset[int]) -> RecordedConfig:
        """From an EngineConfig and the CPUs its context reserved (reservedSystemCPUs, or the
        ones picked for kubeReserved + systemReserved)."""
        return cls(str(config.topology_manager_policy), str(config.cpu_manager_policy),
                   str(config.memory_manager_policy), frozenset(reserved_cpus))

    def to_dict(self) -> dict[str, Any]:
        return {"topologyManagerPolicy": self.topology_manager_policy,
                "cpuManagerPolicy": self.cpu_manager_policy,
                "memoryManagerPolicy": self.memory_manager_policy,
                "reservedCPUs": format_list(self.reserved_cpus)}

    @classmethod
    def from_dict(cls, raw: Any) -> RecordedConfig:
        if not isinstance(raw, dict):
            raise RecordError(f"{PAYLOAD_KEY} must be an object, not {type(raw).__name__}")
        values = []
        for key in ("topologyManagerPolicy", "cpuManagerPolicy", "memoryManagerPolicy",
                    "reservedCPUs"):
            if not isinstance(raw.get(key), str):
                raise RecordError(f"{PAYLOAD_KEY}.{key} must be a string, not {raw.get(key)!r}")
            values.append(raw[key])
        try:
            reserved = parse_list(values[3])
        except ListFormatError as e:
            raise RecordError(f"{PAYLOAD_KEY}.reservedCPUs: {e}") from None
        return cls(values[0], values[1], values[2], reserved)

    def changes_to(self, now: RecordedConfig) -> list[str]:
        """``key old → new`` for each setting that differs."""
        before, after = self.to_dict(), now.to_dict()
        return [f"{key} {_shown(before[key])} → {_shown(after[key])}"
                for key in before if before[key] != after[key]]


def _shown(value: str) -> str:
    return repr(value) if value else '""'


def refuse_change(path: Path | str, changes: list[str],
                  containers: int) -> ConfigChangedError:
    """The error for a configuration change under live placements: what changed, and how to
    drain."""
    held = f"{containers} container{'s' if containers != 1 else ''}"
    return ConfigChangedError(
        f"the configuration changed while {path} holds the placements of {held}: "
        f"{'; '.join(changes)}. Placements made under the old settings cannot be kept under the "
        f"new ones. Either go back to the old settings, or drain this node first: remove its "
        f"pods (or stop the containers the plugin placed), then, when no container runs, "
        f"delete {path} and start nri-numa again")


def checkpoint_config_matches(store: CheckpointStore, payload: dict[str, Any],
                              now: RecordedConfig, containers: int) -> bool:
    """Whether a checkpoint's payload was written under the settings configured now. A change
    is refused (ConfigChangedError) while it holds containers; with none, the file is set
    aside (False). One that does not record them (an earlier nri-numa wrote it) passes: its
    ledger is still checked against the configuration."""
    raw = payload.get(PAYLOAD_KEY)
    if raw is None:
        log.info("%s does not record its configuration (an earlier nri-numa wrote it)",
                 store.path)
        return True
    changes = RecordedConfig.from_dict(raw).changes_to(now)
    if not changes:
        return True
    if containers:
        raise refuse_change(store.path, changes, containers)
    store.set_aside(f"configuration changed ({'; '.join(changes)}), no container held")
    return False
