"""The machine and configuration a hook process decides with, loaded fast.

Discovery reads hundreds of sysfs files (and NVML): far too slow to repeat in every hook run. A
``--topology`` file is used as given; otherwise the first run discovers the machine and keeps it
in the state folder (``topology.json``, which /run empties at every boot), and later runs reuse
it as long as the kernel's list of online CPUs still matches it. The configuration is the
plugin's KubeletConfiguration keys; a JSON file is read without loading the YAML parser.

The kept topology is state like the checkpoint, read and written the same way
(nri_numa.safeio.safe_files): never through a symlink or a symlinked state folder, never waiting
on a FIFO, bounded in size and nesting. One that cannot be used is discovered again and
replaced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nri_numa.agent.inputs import InputFileError, read_config_file, read_topology_file
from nri_numa.engine.config import ConfigError, EngineConfig
from nri_numa.engine.context import EngineContext
from nri_numa.safeio.bounded_json import JsonShapeError, check_shape
from nri_numa.safeio.safe_files import (CREATE_NEW, UnusableFile, open_file, open_folder,
                                       read_regular)
from nri_numa.state.checkpoint import machine_fingerprint
from nri_numa.topology.cpulist import ListFormatError, parse_list
from nri_numa.topology.model import Topology, TopologyFormatError

TOPOLOGY_CACHE = "topology.json"
MAX_CACHE_BYTES = 64 << 20  # a 1024-CPU machine's topology is under 1 MiB
ONLINE_CPUS = Path("sys/devices/system/cpu/online")


class MachineError(Exception):
    """The topology or configuration cannot be used; the message says what to fix."""


@dataclass(frozen=True, slots=True)
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
    online = online_cpus(sysfs_root)
    try:
        folder = open_folder(state_dir, create=True)
    except UnusableFile as e:
        raise MachineError(f"state folder {e}") from None
    try:
        topology = _kept(folder, state_dir / TOPOLOGY_CACHE)
        if topology is not None and topology.online_cpus == online:
            return topology
        from nri_numa.topology import discover

        topology = discover(sysfs_root)
        _keep(folder, topology.to_json(indent=None))
        return topology
    finally:
        os.close(folder)


def _kept(folder: int, shown: Path) -> Topology | None:
    """The kept topology; None when missing or unusable in any way: discovered again."""
    try:
        contents = read_regular(TOPOLOGY_CACHE, folder, MAX_CACHE_BYTES, shown)
        if contents is None:
            return None
        check_shape(contents.data)  # json.loads would recurse without end on 100000 "["
        return Topology.from_json(contents.data.decode("utf-8"))
    except (UnusableFile, JsonShapeError, UnicodeDecodeError, TopologyFormatError):
        return None


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


def _keep(folder: int, text: str) -> None:
    """Write the cache atomically; a failure only costs the next run a discovery. The temp
    file is new (O_EXCL, not following links) and the rename replaces whatever has the name,
    writing through nothing."""
    import secrets  # only here: a hook that finds the cache never loads it

    temp = f"{TOPOLOGY_CACHE}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = open_file(temp, CREATE_NEW, folder=folder)
    except (UnusableFile, OSError):
        return
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(temp, TOPOLOGY_CACHE, src_dir_fd=folder, dst_dir_fd=folder)
    except OSError:
        try:
            os.unlink(temp, dir_fd=folder)
        except OSError:
            pass


def _one_line(e: Exception) -> str:
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
