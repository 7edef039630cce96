"""Whether and how ``nri-numa run`` exports its NodeResourceTopology (docs/kubernetes.md)."""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


class ExportSetupError(ValueError):
    """The export was asked for and cannot run; the text says what to fix."""


@dataclass(frozen=True, slots=True)
class ExportPlan:
    kubeconfig: str | None  # None: the pod's service account
    node_name: str
    resync_s: float
    evict: bool = True
    evict_after: int = 3
    eviction_delay_s: float = 30.0


def export_plan(mode: str, kubeconfig: Path | None, node_name: str, resync_s: float,
                environ: Mapping[str, str], token: Path = SERVICE_ACCOUNT_TOKEN,
                evict: tuple[bool, int, float] = (True, 3, 30.0)) -> ExportPlan | None:
    """None when there is nothing to export to (mode off, or auto with neither a kubeconfig nor
    a service account); ExportSetupError when the export is asked for and cannot run."""
    if mode == "off":
        return None
    in_cluster = bool(environ.get("KUBERNETES_SERVICE_HOST")) and token.is_file()
    if kubeconfig is None and not in_cluster:
        if mode == "on":
            raise ExportSetupError("nrtExport is on, but there is no --kubeconfig and no service "
                                   f"account ({token} with KUBERNETES_SERVICE_HOST set)")
        return None
    if kubeconfig is not None and not kubeconfig.is_file():
        raise ExportSetupError(f"--kubeconfig {kubeconfig}: no such file")
    if importlib.util.find_spec("kubernetes") is None:
        raise ExportSetupError("the NodeResourceTopology export needs the kubernetes client: "
                               "pip install 'nri-numa[cluster]' (or --nrt-export off)")
    name = node_name or environ.get("NODE_NAME", "") or socket.gethostname().lower()
    return ExportPlan(str(kubeconfig) if kubeconfig else None, name, resync_s, *evict)


def nrt_snapshot(committed: Callable[[], tuple[Any, Any]],
                 node_name: str) -> Callable[[], dict[str, Any]]:
    """What the feed sends: the object for the ledger's committed state, carrying the node's
    published state (nri_numa.cluster.node_state) for the scheduler extender."""
    import logging
    import time

    from nri_numa.cluster.node_state import ANNOTATION, MAX_TEXT, encode
    from nri_numa.cluster.nrt import node_resource_topology

    too_big = logging.getLogger("nri_numa.cluster").warning

    def snapshot() -> dict[str, Any]:
        ctx, allocations = committed()
        # Built only when the ledger changed: the time orders publications across restarts.
        state = encode(ctx.topology, ctx.config, allocations, time.time_ns() // 1_000_000)
        if len(state) > MAX_TEXT:
            too_big("the node's published state is %d characters, more than an annotation may "
                    "hold (%d): the scheduler extender will not see this node's ledger",
                    len(state), MAX_TEXT)
            return node_resource_topology(ctx, allocations, node_name)
        return node_resource_topology(ctx, allocations, node_name, {ANNOTATION: state})
    return snapshot
