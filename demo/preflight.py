"""What the demo needs before it starts anything: root, a cpuset cgroup controller, two online
CPUs or more (CPU 0 among them: it is the reserved one), and the unpacked runtimes. Each missing
piece is a DemoUnavailable whose message is one line."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from demo.rows import MachineFacts
from nri_numa.topology import discover
from nri_numa.topology.cpulist import format_list, parse_list
from tests.e2e.harness.cgroups import CgroupLayout, detect_layout
from tests.e2e.harness.runtimes import (RUNC, RUNTIME_VERSIONS, ContainerdBinaries, RuntimesUnavailable,
                                        cache_dir, find_busybox, find_containerd)
from tests.e2e.nri_agent import CONFIG

SHORT_VERSIONS = {v.rsplit(".", 1)[0]: v for v in RUNTIME_VERSIONS}  # "2.1" -> "2.1.9"


class DemoUnavailable(Exception):
    """This machine cannot run the demo; str() says why, in one line."""


@dataclass(frozen=True)
class Ready:
    machine: MachineFacts
    layout: CgroupLayout
    containerd: ContainerdBinaries
    busybox: Path


def full_version(short: str) -> str:
    """"2.1" (or "2.1.9") -> "2.1.9"; anything else is DemoUnavailable naming the choices."""
    if short in RUNTIME_VERSIONS:
        return short
    if short in SHORT_VERSIONS:
        return SHORT_VERSIONS[short]
    raise DemoUnavailable(f"containerd {short!r} is not one the demo has; choose "
                          f"{' or '.join(SHORT_VERSIONS)}")


def machine_facts() -> MachineFacts:
    topology = discover("/")
    node_of = {c.id: c.numa for c in topology.cpus if c.online and c.numa is not None}
    return MachineFacts(topology.online_cpus, node_of, parse_list(CONFIG["reservedSystemCPUs"]))


def check_machine(machine: MachineFacts) -> None:
    if len(machine.online) < 2:
        raise DemoUnavailable(f"the demo needs 2 online CPUs or more (one reserved, one to give "
                              f"away); this machine has {format_list(machine.online) or 'none'}")
    if not machine.reserved <= machine.online:
        raise DemoUnavailable(f"the demo reserves CPU {format_list(machine.reserved)}, which is "
                              f"not online here (online: {format_list(machine.online)})")


def preflight(version: str) -> Ready:
    if os.geteuid() != 0:
        raise DemoUnavailable("the demo needs root: it runs containerd and runc and creates cgroups")
    machine = machine_facts()
    check_machine(machine)
    try:
        layout = detect_layout()
    except RuntimeError as exc:
        raise DemoUnavailable(f"the demo needs a cpuset cgroup controller: {exc}") from None
    if not os.access(RUNC, os.X_OK):
        raise DemoUnavailable(f"{RUNC} is missing (Debian package runc); run ./scripts/setup first")
    try:
        binaries = find_containerd(cache_dir(), full_version(version))
        busybox = find_busybox()
    except RuntimesUnavailable as exc:
        raise DemoUnavailable(f"{exc}; run ./scripts/setup first") from None
    return Ready(machine, layout, binaries, busybox)
