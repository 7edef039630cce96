"""The machine and configuration a hook process decides with, loaded fast.

Discovery reads hundreds of sysfs files (and NVML): far too slow to repeat in every hook run. A
``--topology`` file is used as given; otherwise the first run discovers the machine and keeps it
in the state folder (``topology.json``, which /run empties at every boot), and later runs reuse
it as long as the kernel's list of online CPUs still matches it. The configuration is the
plugin's KubeletConfiguration keys; a JSON file is read without loading the YAML parser.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nri_numa.agent.inputs import InputFileError, read_config_file, read_topology_file
from nri_numa.engine.config import ConfigError, EngineConfig
from nri_numa.engine.context import EngineContext
from nri_numa.state.checkpoint import machine_fingerprint
from nri_numa.topology.cpulist import ListFormatError, parse_list
from nri_numa.topology.model import Topology, TopologyFormatError

TOPOLOGY_CACHE = "topology.json"
ONLINE_CPUS = Path("sys/devices/system/cpu/online")


class MachineError(Exception):
    """The topology or configuration cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class Machine:
    topology: Topology
    ctx: EngineContext
    fingerprint: str  # what the checkpoint must have been written for


def load_machine(state_dir: Path, config_file: Path | None, topology_file: Path | None,
                 sysfs_root: Path = Path("/")) -> Machine:
    if topology_file is not None:
        topology = _read_topology(topology_file)
    else:
        topology = cached_topology(state_dir, sysfs_root)
    config = load_config(config_file)
    try:
        ctx = EngineContext.build(topology, config)
    except ConfigError as e:
        raise MachineError(f"the configuration does not fit this machine: {_one_line(e)}") from None
    return Machine(topology, ctx, machine_fingerprint(topology))


def load_config(path: Path | None) -> EngineConfig:
    """KubeletConfiguration keys from YAML or JSON; every policy ``none`` without a file."""
    if path is None:
        return EngineConfig()
    try:
        return read_config_file(path)
    except InputFileError as e:
        raise MachineError(str(e)) from None


def cached_topology(state_dir: Path, sysfs_root: Path = Path("/")) -> Topology:
    """The kept discovery when the online CPUs still match it; else discover and keep."""
    cache = state_dir / TOPOLOGY_CACHE
    online = online_cpus(sysfs_root)
    try:
        topology = Topology.from_json(cache.read_text())
    except (OSError, TopologyFormatError):
        topology = None  # missing or damaged: discover again
    if topology is not None and topology.online_cpus == online:
        return topology
    from nri_numa.topology import discover

    topology = discover(sysfs_root)
    _keep(cache, topology.to_json(indent=None))
    return topology


def _read_topology(path: Path) -> Topology:
    try:
        return read_topology_file(path)
    except InputFileError as e:
        raise MachineError(str(e)) from None


def online_cpus(sysfs_root: Path = Path("/")) -> frozenset[int] | None:
    """The kernel's list of online CPUs; None when it cannot be read."""
    try:
        return parse_list((sysfs_root / ONLINE_CPUS).read_text())
    except (OSError, ListFormatError):
        return None  # cannot tell: the cache is not trusted


def _keep(cache: Path, text: str) -> None:
    """Write the cache atomically; a failure only costs the next run a discovery."""
    try:
        cache.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=cache.parent, prefix=TOPOLOGY_CACHE + ".tmp-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(temp, cache)
    except OSError:
        try:
            os.unlink(temp)
        except OSError:
            pass


def _one_line(e: Exception) -> str:
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
