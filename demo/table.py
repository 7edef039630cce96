"""The demo's printed output: the table of where each container landed and a few lines saying
why (the policy, the exclusive CPUs, the shared pool)."""

from __future__ import annotations

import re
import textwrap

from demo.rows import GUARANTEED, DemoResult, Row
from nri_numa.topology.cpulist import format_list

HEADERS = ("POD", "QOS", "ASKED", "cpuset.cpus", "cpuset.mems", "Cpus_allowed_list",
           "Mems_allowed_list")
WIDTH = 100
_LONG_ID = re.compile(r"\b(pod)?([0-9a-f]{8})[0-9a-f-]{16,}")


def short_cgroup(path: str) -> str:
    """Pod uids and container ids cut to 8 hex digits: the path stays recognisable and short."""
    return _LONG_ID.sub(lambda m: f"{m.group(1) or ''}{m.group(2)}…", path)


def cells(row: Row) -> tuple[str, ...]:
    return (row.pod, row.qos, row.asked, row.cpus, row.mems, row.inside_cpus, row.inside_mems)


def sources(result: DemoResult) -> list[str]:
    """Where each row's cpuset files are (ids shortened)."""
    width = max(len(row.pod) for row in result.rows)
    return [f"  {row.pod.ljust(width)}  {result.cgroup_mount}{short_cgroup(row.cgroup)}/cpuset.{{cpus,mems}}"
            for row in result.rows]


def render_table(rows: tuple[Row, ...]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    table = [HEADERS, *(cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in table]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def explain(result: DemoResult) -> list[str]:
    """A few sentences about what happened, every figure taken from the rows and the machine."""
    machine, config = result.machine, result.config
    guaranteed = next(r for r in result.rows if r.qos == GUARANTEED)
    shared = [r for r in result.rows if r.qos != GUARANTEED]
    pool = machine.online - guaranteed.cpu_ids
    nodes = len(machine.nodes)
    sentences = [
        f"Policy: CPU manager {config['cpuManagerPolicy']}, reservedSystemCPUs "
        f"{config['reservedSystemCPUs']}, topology manager {config['topologyManagerPolicy']} "
        f"(this machine: {_plural(len(machine.online), 'CPU')} {format_list(machine.online)} on "
        f"{_plural(nodes, 'NUMA node')}; a 1-CPU pod always fits on one node, so the strictest "
        f"policy is safe on any machine with 2 CPUs or more).",
        f"Pod {guaranteed.pod} asked for whole CPUs with requests = limits, so it got CPU "
        f"{guaranteed.cpus} to itself; no other container may run there. Its memory nodes "
        f"({guaranteed.mems}) are left as they were: without the Memory Manager the kubelet "
        f"does not pin memory either.",
        f"Shared pool: CPU {format_list(pool)} = the online CPUs minus the exclusive ones. It keeps "
        f"the reserved CPU {config['reservedSystemCPUs']}, which is never given away exclusively, "
        f"so it is never empty. Pods {' and '.join(r.pod for r in shared)} run there.",
        f"The BestEffort container was started first, on CPU {result.besteffort_before}; the "
        f"plugin moved it to {format_list(pool)} while answering the Guaranteed container's "
        f"CreateContainer, before that container started.",
        "Every value in the table was read back: cpuset.cpus/cpuset.mems from each container's "
        "cgroup on the host, Cpus_allowed_list/Mems_allowed_list from /proc/self/status inside "
        "the container (CRI ExecSync). The cgroups:",
    ]
    return [textwrap.fill(s, WIDTH, subsequent_indent="  ") for s in sentences] + sources(result)
