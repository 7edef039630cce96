"""Virtual nodes for trying the scheduler extender without the hardware: Node objects made from
synthetic machines (dgx-h100, amd-epyc-2s-nps4, gb200, ...), kept Ready the way kwok keeps its
nodes, each publishing a NodeResourceTopology object with the node state a real nri-numa agent
publishes (docs/scheduler-extender.md, "Trying it without the hardware").

    python -m nri_numa.cluster.virtual_nodes [--kubeconfig FILE] [--config FILE] dgx-h100=2 gb200

For each node the keeper

- creates the Node (capacity from the machine, a NoSchedule taint ``numa.nri.io/virtual-node``)
  and its Lease in ``kube-node-lease``, and renews both the Lease and the Ready condition every
  ``--heartbeat`` seconds, or the node lifecycle controller would mark it unreachable;
- plays the node agent: it follows the pods bound to the node and admits each, in the order
  they were bound, on the node's ledger with the same engine (``state.Ledger``), releases
  the pods that are gone, and publishes the ledger through the agent's own object builder and
  writer (``cluster.start.nrt_snapshot``, ``cluster.nrt_writer``). So the extender's assumed
  pods are released by a publication that shows them, as on a real node, not by its timeout.
  A pod the ledger refuses is logged as the agent would refuse its container;
- finishes the deletion of a pod bound there (no kubelet will: grace 0, as kwok does);
- on SIGTERM or SIGINT deletes the pods bound to its nodes, their objects and the nodes
  (``--keep`` leaves them).

Pods bound to a virtual node never run.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nri_numa.cluster.nrt import GROUP, PLURAL, VERSION
from nri_numa.cluster.nrt_writer import REQUEST_TIMEOUT, ApiError, KubernetesNrtApi, NrtWriter
from nri_numa.cluster.start import nrt_snapshot
from nri_numa.cluster.virtual_node_objects import (LEASE_NAMESPACE, VirtualNode,
                                                   VirtualNodeError, default_config,
                                                   heartbeat_patch, lease_object, node_object,
                                                   parse_spec, virtual_nodes)
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.engine.request import RequestError
from nri_numa.runtime.to_request import with_scheduled_numa
from nri_numa.safeio.bounds import BoundError
from nri_numa.state.ledger import Ledger

log = logging.getLogger("nri_numa.virtual_nodes")

HEARTBEAT_S = 10.0  # the kubelet renews its lease every 10 s (a quarter of its duration)
POLL_S = 0.5  # how often the pods bound to the nodes are listed
RESYNC_S = 30.0  # how often each NRT object is read back and mended


@dataclass
class _Kept:
    """What the keeper holds for one node: its ledger, its refusals and its NRT writer."""

    node: VirtualNode
    ledger: Ledger
    writer: NrtWriter
    since: float
    uid: str | None = None
    refused: set[str] = field(default_factory=set)
    changed: bool = True


class Keeper:
    def __init__(self, api_client: Any, nodes: tuple[VirtualNode, ...], *, taint: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._leases = client.CoordinationV1Api(api_client)
        self._clock = clock
        self._taint = taint
        now = clock()
        self.kept = {n.name: _Kept(n, Ledger(n.ctx), NrtWriter(KubernetesNrtApi(api_client)), now)
                     for n in nodes}
        self._next_heartbeat = self._next_resync = 0.0

    # --- register and remove -----------------------------------------------------------------

    def register(self) -> None:
        """Creates (or takes over) every Node and Lease and publishes the empty ledgers."""
        for kept in self.kept.values():
            body = node_object(kept.node, kept.since, taint=self._taint)
            try:
                created = self._call(self._core.create_node, body)
            except ApiError as e:
                if e.status != 409:
                    raise
                # A node left by an earlier keeper: its status and labels become ours again.
                self._call(self._core.patch_node, kept.node.name,
                           {"metadata": body["metadata"], "spec": body["spec"]})
                created = self._call(self._core.patch_node_status, kept.node.name,
                                     {"status": body["status"]})
            kept.uid = created["metadata"]["uid"]
        self.heartbeat(force=True)
        self.sync_pods()

    def remove(self) -> None:
        """Deletes the pods bound to the nodes, the nodes' NRT objects, Leases and Nodes."""
        for pod in self._bound_pods():
            self._finish_delete(pod)
        from kubernetes import client

        custom = client.CustomObjectsApi(self._core.api_client)
        for name in self.kept:
            for call in (lambda: self._call(custom.delete_cluster_custom_object, GROUP, VERSION,
                                            PLURAL, name),
                         lambda: self._call(self._leases.delete_namespaced_lease, name,
                                            LEASE_NAMESPACE),
                         lambda: self._call(self._core.delete_node, name)):
                try:
                    call()
                except ApiError as e:
                    if e.status != 404:
                        log.warning("virtual node %s: not removed: %s", name, e)

    # --- the loop ----------------------------------------------------------------------------

    def run(self, stop: threading.Event, poll_s: float = POLL_S) -> None:
        while not stop.is_set():
            try:
                self.heartbeat()
                self.sync_pods()
            except ApiError as e:  # the API server is away: keep trying
                log.warning("virtual nodes: %s", e)
                stop.wait(2.0)
            except Exception:  # the nodes must outlive any one surprise; the log has it
                log.exception("virtual nodes: one round failed; going on")
                stop.wait(2.0)
            stop.wait(poll_s)

    def heartbeat(self, force: bool = False) -> None:
        now = self._clock()
        if not force and now < self._next_heartbeat:
            return
        self._next_heartbeat = now + HEARTBEAT_S
        for name, kept in self.kept.items():
            lease = lease_object(name, now, kept.uid)
            try:
                self._call(self._leases.replace_namespaced_lease, name, LEASE_NAMESPACE,
                           self._with_version(lease, name))
            except ApiError as e:
                if e.status != 404:
                    raise
                self._call(self._leases.create_namespaced_lease, LEASE_NAMESPACE, lease)
            self._call(self._core.patch_node_status, name,
                       heartbeat_patch(kept.node, now, kept.since))

    def _with_version(self, lease: dict[str, Any], name: str) -> dict[str, Any]:
        current = self._call(self._leases.read_namespaced_lease, name, LEASE_NAMESPACE)
        lease["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return lease

    def sync_pods(self) -> None:
        """Admits the pods newly bound to each node, releases the gone ones, finishes
        deletions, and publishes every ledger that changed (all of them at each resync)."""
        by_node: dict[str, list[dict[str, Any]]] = {name: [] for name in self.kept}
        for pod in self._bound_pods():
            if pod["metadata"].get("deletionTimestamp"):
                self._finish_delete(pod)
            elif pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                by_node[pod["spec"]["nodeName"]].append(pod)
        for name, pods in by_node.items():
            self._follow(self.kept[name], pods)
        now = self._clock()
        resync = now >= self._next_resync
        if resync:
            self._next_resync = now + RESYNC_S
        for kept in self.kept.values():
            if kept.changed or resync:
                self._publish(kept, read_first=resync)

    def _follow(self, kept: _Kept, pods: list[dict[str, Any]]) -> None:
        bound = {p["metadata"]["uid"]: p for p in pods}
        for uid in [u for u in kept.ledger.allocations.pods if u not in bound]:
            kept.ledger.release(uid)
            kept.changed = True
        kept.refused &= set(bound)
        for pod in sorted(bound.values(), key=_bind_order):
            uid = pod["metadata"]["uid"]
            if uid in kept.ledger.allocations.pods or uid in kept.refused:
                continue
            where = f"{pod['metadata'].get('namespace', 'default')}/{pod['metadata']['name']}"
            try:
                # As the node's agent reads it: inside the extender's NUMA nodes while they fit.
                request, unreadable = with_scheduled_numa(
                    pod_from_manifest(pod), (n.id for n in kept.ledger.ctx.topology.numa_nodes))
                if unreadable:
                    log.warning("virtual node %s, pod %s: %s", kept.node.name, where, unreadable)
                result = kept.ledger.admit(request)
            except (RequestError, BoundError, ValueError) as e:
                kept.refused.add(uid)
                log.warning("virtual node %s refuses pod %s: cannot read it: %s", kept.node.name,
                            where, " ".join(str(e).split())[:300])
                continue
            if result.decision.admitted:
                kept.changed = True
                log.info("virtual node %s placed pod %s", kept.node.name, where)
            else:
                kept.refused.add(uid)
                log.warning("virtual node %s refuses pod %s, as its agent would refuse the "
                            "container: %s", kept.node.name, where,
                            result.decision.rejection.message)

    def _publish(self, kept: _Kept, *, read_first: bool) -> None:
        ledger = kept.ledger
        desired = nrt_snapshot(lambda: (ledger.ctx, ledger.allocations), kept.node.name)()
        kept.writer.ensure(desired, read_first=read_first)
        kept.changed = False

    # --- pods --------------------------------------------------------------------------------

    def _bound_pods(self) -> list[dict[str, Any]]:
        listed = self._call(self._core.list_pod_for_all_namespaces,
                            field_selector="spec.nodeName!=")
        return [p for p in listed.get("items", []) if p["spec"].get("nodeName") in self.kept]

    def _finish_delete(self, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            # Grace 0 in the body: the client's body would override a query parameter.
            self._call(self._core.delete_namespaced_pod, meta["name"], meta["namespace"],
                       body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
        except ApiError as e:
            if e.status not in (404, 409):
                raise

    @staticmethod
    def _call(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The call's JSON answer as plain values (the typed models are not needed)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            answer = method(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT,
                            **kwargs)
        except ApiException as e:
            raise ApiError(e.status or 0, f"{e.status} {e.reason}: {str(e.body)[:300]}") from None
        except (HTTPError, OSError) as e:
            raise ApiError(0, f"no answer: {str(e)[:300]}") from None
        return json.loads(answer.data or b"{}")


def _bind_order(pod: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """When the pod was bound (its PodScheduled condition, to the second), then when it was
    made: the order in which the scheduler sent them, as near as the API says."""
    scheduled = next((c.get("lastTransitionTime", "") for c in
                      pod.get("status", {}).get("conditions", []) or []
                      if c.get("type") == "PodScheduled"), "")
    meta = pod["metadata"]
    return scheduled, meta.get("creationTimestamp", ""), meta.get("namespace", ""), meta["name"]


# --- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nri_numa.cluster.virtual_nodes",
        description="Keep virtual Nodes made from synthetic machines Ready, each publishing the "
                    "node state nri-numa's scheduler extender reads; no kubelet, no pod runs.")
    parser.add_argument("nodes", nargs="+", metavar="PRESET[=COUNT]",
                        help="a preset of `nri-numa presets`, and how many nodes of it (1)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: the pod's service account)")
    parser.add_argument("--config", help="KubeletConfiguration keys every node runs under "
                        "(YAML; default: static CPU policy with full-pcpus-only, single-numa-node "
                        "for the whole pod, kubeReserved cpu 2)")
    parser.add_argument("--prefix", default="virtual-", help="node names are "
                        "<prefix><preset>-<i> (default virtual-)")
    parser.add_argument("--no-taint", action="store_true",
                        help="leave out the NoSchedule taint numa.nri.io/virtual-node")
    parser.add_argument("--keep", action="store_true",
                        help="leave the nodes and their pods in place on exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        nodes = virtual_nodes([parse_spec(t) for t in args.nodes], _config(args.config),
                              args.prefix)
        from nri_numa.cluster.export_process import api_client

        client = api_client(args.kubeconfig)
    except (VirtualNodeError, OSError) as e:
        print(f"virtual-nodes: error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"virtual-nodes: error: the kubernetes client is not installed (the cluster "
              f"extra): {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the client's kubeconfig errors have no common type
        print(f"virtual-nodes: error: --kubeconfig: {' '.join(str(e).split())[:200]}",
              file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    keeper = Keeper(client, nodes, taint=not args.no_taint)
    try:
        keeper.register()
    except ApiError as e:
        print(f"virtual-nodes: error: cannot register the nodes: {e}", file=sys.stderr)
        return 1
    log.info("keeping %d virtual nodes: %s", len(nodes), ", ".join(n.name for n in nodes))
    keeper.run(stop)
    if not args.keep:
        keeper.remove()
        log.info("removed the virtual nodes and the pods bound to them")
    return 0


def _config(path: str | None) -> Any:
    if path is None:
        return default_config()
    from nri_numa.engine.config import ConfigError
    from nri_numa.engine.config_reader import config_from_mapping
    from nri_numa.safeio.documents import DocumentError, load_yaml

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1024 * 1024 + 1)
    except (OSError, UnicodeDecodeError) as e:
        raise VirtualNodeError(f"--config {path}: {getattr(e, 'strerror', None) or e}") from None
    if len(text) > 1024 * 1024:
        raise VirtualNodeError(f"--config {path}: more than 1 MiB")
    try:
        documents = [d for d in load_yaml(text, f"--config {path}") if d is not None]
        return config_from_mapping(documents[0] if documents else {})
    except (DocumentError, ConfigError) as e:
        raise VirtualNodeError(" ".join(str(e).split())[:400]) from None


if __name__ == "__main__":
    sys.exit(main())
