"""The extender's verbs on kube-scheduler 1.20's wire types (k8s.io/kube-scheduler/extender/v1:
ExtenderArgs, ExtenderFilterResult, HostPriorityList, ExtenderBindingArgs/Result), as plain
JSON values. Pure but for the cache and the API they are given.

filter keeps a node when the node's own engine admits the whole pod there, under the node's
policy and scope, on its ledger plus the pods already sent there (assumed); each dropped node
gets the engine's refusal line. prioritize ranks the admitted nodes: fewer NUMA nodes first,
then the CPUs left free (least allocated, the default) or taken (most allocated). bind admits
once more on the chosen node, holds the pod as assumed there, records the NUMA nodes the
simulation chose on the pod and binds it. Nodes without a publication pass through: kept by
filter, scored 0 by prioritize, bound without an annotation.

bind binds only what a scheduling cycle of this extender led to: a pod filtered here within the
assume window, to a node that filter kept, that the API server still shows Pending, unbound,
for the configured scheduler and with the spec filter judged; the Binding carries the pod's uid
as its precondition. Anything else is refused with one line, logged. filter remembers, per node,
the pods it refused there, so that a publication freeing room can have them retried
(``take_refused``).

Each node's decisions are kept by pod shape (nri_numa.extender.shapes) while the node's working
allocations stay the same object: prioritize reuses filter's, and the replicas of a pod reuse
the first one's, so a Deployment's pods cost one admission per node, not one each.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from nri_numa.engine.admit import admit
from nri_numa.engine.decision import Decision
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.engine.request import PodRequest, RequestError
from nri_numa.extender.cache import NodeCache
from nri_numa.extender.shapes import pod_shape
from nri_numa.safeio.bounds import BoundError
from nri_numa.topology.cpulist import format_list

log = logging.getLogger(__name__)

MAX_PRIORITY = 10  # extenderv1.MaxExtenderPriority in 1.20
CHOSEN_NUMA_ANNOTATION = "numa.nri.io/scheduled-numa-nodes"
MAX_PODS_REMEMBERED = 4096  # filter's pods kept for bind, which names the pod but sends no spec
DEFAULT_SCHEDULER = "default-scheduler"  # a pod's spec.schedulerName when it names none
# Per node, the decisions kept for pod shapes on its current working allocations: filter's for
# prioritize, and one pod's for its replicas.
MAX_SHAPES_PER_NODE = 256


class Packing(StrEnum):
    LEAST_ALLOCATED = "LeastAllocated"
    MOST_ALLOCATED = "MostAllocated"


class VerbError(ValueError):
    """A request the extender cannot read; the message is one line for the Error field."""


class PodApi(Protocol):
    """The API server as bind uses it (nri_numa.extender.watch.ApiPods); each method raises
    with a one-line message when the server fails."""

    def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod as the API server has it now; None when there is none."""

    def bind(self, namespace: str, name: str, uid: str, node: str,
             annotations: Mapping[str, str]) -> None:
        """Write ``annotations`` on the pod and bind it to ``node``, both only while the pod's
        uid is ``uid``."""


@dataclass(frozen=True)
class Filtered:
    """A pod filter judged, and what that allows bind to do."""
    pod: PodRequest
    at: float  # the cache's clock
    kept: frozenset[str]  # the nodes filter kept


@dataclass(frozen=True)
class RefusedPod:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Verdict:
    node: str
    decision: Decision | None  # None: the node publishes nothing, passed through

    @property
    def admitted(self) -> bool:
        return self.decision is None or self.decision.admitted


def numa_nodes_of(decision: Decision) -> frozenset[int]:
    """The NUMA nodes the decision's placements are aligned to: their hints' affinity."""
    nodes: set[int] = set()
    for p in decision.placements:
        if p.hint.affinity is not None:
            nodes |= p.hint.affinity
    return frozenset(nodes)


class Extender:
    def __init__(self, cache: NodeCache, api: PodApi | None = None,
                 packing: Packing = Packing.LEAST_ALLOCATED,
                 scheduler_name: str = DEFAULT_SCHEDULER) -> None:
        self.cache = cache
        self.api = api  # None: nothing is read or bound (tests, the bench)
        self.packing = Packing(packing)
        self.scheduler_name = scheduler_name
        self._pods: OrderedDict[str, PodRequest] = OrderedDict()
        self._filtered: OrderedDict[str, Filtered] = OrderedDict()  # pod uid → its last filter
        self._refused: dict[str, dict[str, RefusedPod]] = {}  # node → pod uid → pod
        self._shapes: dict[str, Any] = {}  # pod uid → its shape, for the pods in _pods
        # node → (the working allocations they were made on, pod shape → decision)
        self._verdicts: dict[str, tuple[Any, dict[Any, Decision]]] = {}
        self._lock = threading.Lock()

    # --- the engine on one node ------------------------------------------------------------

    def verdict(self, node: str, pod: PodRequest) -> Verdict:
        """The node's decision for ``pod`` (None: the node publishes nothing)."""
        verdict = self._verdict(node, pod, self._shape_of(pod))
        decision = verdict.decision
        if decision is not None and decision.pod != pod.uid:
            return Verdict(node, replace(decision, pod=pod.uid))
        return verdict

    def _verdict(self, node: str, pod: PodRequest, shape: Hashable) -> Verdict:
        """``verdict``, but the decision may be one made for a replica of ``pod`` and name
        that replica's uid: filter and prioritize never read it."""
        entry = self.cache.entry(node)
        if entry is None:
            if node in self._verdicts:  # a node gone or no longer publishing: forget its own
                with self._lock:
                    self._verdicts.pop(node, None)
            return Verdict(node, None)
        if pod.uid in entry.working.pods:  # already sent here: a retried cycle
            return Verdict(node, Decision(pod.uid, "", "", ()))
        # The node's answer for a pod of this shape stands while its working allocations are
        # the very object it was made from (nri_numa.extender.shapes says why the uid does not
        # matter): prioritize after filter, and the replicas of a pod, reuse it.
        with self._lock:
            made_on, decisions = self._verdicts.get(node, (None, None))
            decision = decisions.get(shape) if made_on is entry.working else None
        if decision is not None:
            return Verdict(node, decision)
        decision = admit(entry.ctx, entry.working, pod).decision
        with self._lock:
            made_on, decisions = self._verdicts.get(node, (None, None))
            if made_on is not entry.working or len(decisions) >= MAX_SHAPES_PER_NODE:
                made_on, decisions = entry.working, {}
                self._verdicts[node] = (made_on, decisions)
            decisions[shape] = decision
        return Verdict(node, decision)

    def _shape_of(self, pod: PodRequest) -> Hashable:
        with self._lock:
            shape = self._shapes.get(pod.uid) if self._pods.get(pod.uid) is pod else None
        return pod_shape(pod) if shape is None else shape

    # --- verbs -----------------------------------------------------------------------------

    def filter(self, args: Any) -> dict[str, Any]:
        try:
            pod, names, shape = self._read(args)
        except VerbError as e:
            return {"NodeNames": None, "FailedNodes": {}, "Error": str(e)}
        kept, failed = [], {}
        for name in names:
            if (problem := self.cache.problem(name)) is not None:
                failed[name] = problem
                continue
            verdict = self._verdict(name, pod, shape)
            if verdict.admitted:
                kept.append(name)
            else:
                failed[name] = f"nri-numa: {verdict.decision.rejection.message}"
        self._remember_filter(pod, kept, failed)
        return {"NodeNames": kept, "FailedNodes": failed, "Error": ""}

    def _remember_filter(self, pod: PodRequest, kept: list[str],
                         failed: Mapping[str, str]) -> None:
        refused = RefusedPod(pod.namespace, pod.name, pod.uid)
        with self._lock:
            self._filtered[pod.uid] = Filtered(pod, self.cache.clock(), frozenset(kept))
            self._filtered.move_to_end(pod.uid)
            while len(self._filtered) > MAX_PODS_REMEMBERED:
                self._filtered.popitem(last=False)
            for node in failed:
                pods = self._refused.setdefault(node, {})
                if len(pods) < MAX_PODS_REMEMBERED:
                    pods[pod.uid] = refused
            for node in kept:
                if node in self._refused:
                    self._refused[node].pop(pod.uid, None)

    def take_refused(self, node: str) -> list[RefusedPod]:
        """The pods filter refused on ``node`` since the last call for it, forgotten here."""
        with self._lock:
            return list(self._refused.pop(node, {}).values())

    def prioritize(self, args: Any) -> list[dict[str, Any]]:
        try:
            pod, names, shape = self._read(args)
        except VerbError:
            return []
        return [{"Host": name, "Score": self.score(self._verdict(name, pod, shape))}
                for name in names]

    def score(self, verdict: Verdict) -> int:
        if verdict.decision is None or not verdict.decision.admitted:
            return 0
        entry = self.cache.entry(verdict.node)
        spread = max(1, len(numa_nodes_of(verdict.decision)))
        alignment = max(0, 6 - 2 * (spread - 1))  # 6 for one NUMA node, 4 for two, ...
        total = max(1, len(entry.ctx.cpus.cpus) if entry else 1)
        free = len(verdict.decision.shared_pool) / total if verdict.decision.shared_pool else 0
        taken = 1.0 - free
        fill = round(4 * (free if self.packing is Packing.LEAST_ALLOCATED else taken))
        return min(MAX_PRIORITY, alignment + fill)

    def bind(self, args: Any) -> dict[str, str]:
        if not isinstance(args, Mapping):
            return {"Error": "bind: the request must be a JSON object"}
        fields = [args.get(k) for k in ("PodNamespace", "PodName", "PodUID", "Node")]
        if not all(isinstance(v, str) and 0 < len(v) <= 1024 for v in fields):
            return {"Error": "bind: PodNamespace, PodName, PodUID and Node must be names"}
        namespace, name, uid, node = fields
        with self._lock:
            filtered = self._filtered.get(uid)
        refusal = self._bind_refusal(filtered, namespace, name, uid, node)
        if refusal is not None:
            log.warning("bind refused: %s", refusal)
            return {"Error": f"nri-numa: bind refused: {refusal}"}
        with self._lock:
            self._filtered.pop(uid, None)  # one bind per filter: a replay is refused
        annotations: dict[str, str] = {}
        result = self.cache.assume(node, filtered.pod)
        if result is not None and not result.decision.admitted:
            return {"Error": f"nri-numa: node {node} no longer admits pod "
                             f"{namespace}/{name}: {result.decision.rejection.message}"}
        if result is not None and (chosen := numa_nodes_of(result.decision)):
            annotations[CHOSEN_NUMA_ANNOTATION] = format_list(chosen)
        if self.api is None:
            return {"Error": ""}
        try:
            self.api.bind(namespace, name, uid, node, annotations)
        except Exception as e:  # the API server's answer, whatever its type: one line back
            return {"Error": f"bind {namespace}/{name} to {node}: {' '.join(str(e).split())[:300]}"}
        return {"Error": ""}

    def _bind_refusal(self, filtered: Filtered | None, namespace: str, name: str, uid: str,
                      node: str) -> str | None:
        """Why this bind is not one a scheduling cycle of this extender led to; None when it
        is."""
        pod_name = f"pod {namespace[:80]}/{name[:80]} ({uid[:40]})"
        if filtered is None or (filtered.pod.namespace, filtered.pod.name) != (namespace, name):
            return f"{pod_name} was not filtered by this extender"
        age = self.cache.clock() - filtered.at
        if age > self.cache.assume_seconds:
            return (f"{pod_name} was filtered {age:.0f} s ago, more than the "
                    f"{self.cache.assume_seconds:g} s a filter holds")
        if node not in filtered.kept:
            return f"node {node[:80]} was not kept by the filter of {pod_name}"
        if self.api is None:
            return None
        try:
            live = self.api.read_pod(namespace, name)
        except Exception as e:  # the API server's answer, whatever its type
            return f"{pod_name} could not be read: {' '.join(str(e).split())[:200]}"
        return _unbindable(live, uid, self.scheduler_name, pod_shape(filtered.pod), pod_name)

    # --- reading ExtenderArgs ----------------------------------------------------------------

    def _read(self, args: Any) -> tuple[PodRequest, list[str], Hashable]:
        if not isinstance(args, Mapping):
            raise VerbError("the request must be a JSON object (ExtenderArgs)")
        names = args.get("NodeNames")
        if names is None and isinstance(args.get("Nodes"), Mapping):  # not nodeCacheCapable
            items = args["Nodes"].get("items") or []
            names = [((n or {}).get("metadata") or {}).get("name") for n in items]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise VerbError("NodeNames must be a list of node names")
        try:
            pod = pod_from_manifest(args.get("Pod"))
        except (RequestError, BoundError, ValueError) as e:
            raise VerbError(f"Pod: {' '.join(str(e).split())[:300]}") from None
        shape = pod_shape(pod)  # once per call, not per node
        with self._lock:
            self._pods[pod.uid] = pod
            self._shapes[pod.uid] = shape
            self._pods.move_to_end(pod.uid)
            while len(self._pods) > MAX_PODS_REMEMBERED:
                self._shapes.pop(self._pods.popitem(last=False)[0], None)
        return pod, names, shape


def _unbindable(live: Mapping[str, Any] | None, uid: str, scheduler_name: str,
                shape: Hashable, pod_name: str) -> str | None:
    """Why the pod as the API server has it may not be bound; None when it may."""
    if not isinstance(live, Mapping):
        return f"{pod_name} does not exist"
    meta, spec = live.get("metadata") or {}, live.get("spec") or {}
    if meta.get("uid") != uid:
        return f"{pod_name} is now another pod (uid {str(meta.get('uid'))[:40]})"
    if spec.get("nodeName"):
        return f"{pod_name} is already bound to {str(spec['nodeName'])[:80]}"
    phase = (live.get("status") or {}).get("phase") or "Pending"
    if phase != "Pending" or meta.get("deletionTimestamp"):
        return f"{pod_name} is not Pending ({'deleting' if meta.get('deletionTimestamp') else phase})"
    wanted = spec.get("schedulerName") or DEFAULT_SCHEDULER
    if wanted != scheduler_name:
        return f"{pod_name} is for scheduler {str(wanted)[:80]}, not {scheduler_name}"
    try:
        same = pod_shape(pod_from_manifest(live)) == shape
    except (RequestError, BoundError, ValueError):
        same = False
    if not same:
        return f"{pod_name} differs from the pod its filter judged"
    return None
