"""Refusals the cluster can act on (docs/kubernetes.md, "Refusals").

A container nri-numa refuses leaves its pod in CreateContainerError on this node, retried by the
kubelet forever. For each refusal the export process posts a Warning Event on the pod with
nri-numa's one line (repeats of the same reason raise the Event's count). A pod that a
controller owns is evicted through the Eviction API once it was refused ``repeats`` times and no
sooner than ``delay_s`` after its first refusal, so its controller makes a new one that the
scheduler can place elsewhere. A bare pod is never deleted: it gets the Events and the annotation
``numa.nri.io/refused`` saying why it cannot start here.

A Guaranteed container the agent had to leave in the shared pool (it was running when the
agent adopted it, and its CPUs were taken: nri_numa.nri.promotion) is no refusal: it runs. The
agent reports it once (``degraded_message``) and its pod gets one Warning Event,
``DEGRADED_REASON``, saying so; never an eviction or an annotation.

``RefusalTracker`` decides (pure); ``PodActions`` carries the decisions out through the
``kubernetes`` client.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from nri_numa.cluster.nrt_writer import REQUEST_TIMEOUT

REFUSED_ANNOTATION = "numa.nri.io/refused"
COMPONENT = "nri-numa"
MAX_TRACKED = 10000  # pods remembered; the oldest are forgotten first
DEGRADED_REASON = "NriNumaDegraded"


def refusal_message(namespace: str, pod: str, uid: str, container: str, reason: str,
                    text: str, node: str, at: float | None = None) -> dict[str, Any]:
    """What the agent sends the export process when it refuses a container."""
    return {"kind": "refusal", "namespace": namespace, "pod": pod, "uid": uid,
            "container": container, "reason": reason, "message": text, "node": node,
            "at": time.time() if at is None else at}


def degraded_message(namespace: str, pod: str, uid: str, container: str, text: str,
                     node: str, at: float | None = None) -> dict[str, Any]:
    """What the agent sends the export process, once, for a container it runs degraded."""
    return {**refusal_message(namespace, pod, uid, container, DEGRADED_REASON, text, node, at),
            "kind": "degraded"}


@dataclass(frozen=True, slots=True)
class Refusal:
    namespace: str
    pod: str
    uid: str
    container: str
    reason: str
    message: str
    node: str
    at: float

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Refusal:
        def text(key: str, limit: int = 253) -> str:
            value = message.get(key)
            if not isinstance(value, str) or not value:
                raise ValueError(f"a refusal without {key}")
            return value[:limit]

        at = message.get("at")
        return cls(text("namespace"), text("pod"), text("uid"), text("container"),
                   text("reason", 128), text("message", 1024), text("node"),
                   float(at) if isinstance(at, int | float) else time.time())


@dataclass(frozen=True, slots=True)
class EvictionPolicy:
    evict: bool = True  # pods owned by a controller
    repeats: int = 3
    delay_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Actions:
    """What to do for one refusal."""

    event_count: int  # the Event's count: 1 creates it, more patches it
    first_at: float
    annotate: bool = False  # a bare pod: say why on the pod
    evict: bool = False


@dataclass
class _PodRefusals:
    first_at: float
    count: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # Event key → count
    annotated: str = ""
    evicted: bool = False


class RefusalTracker:
    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self._pods: dict[str, _PodRefusals] = {}

    def refused(self, refusal: Refusal, owned_by_controller: bool) -> Actions:
        seen = self._pods.get(refusal.uid)
        if seen is None:
            if len(self._pods) >= MAX_TRACKED:
                del self._pods[next(iter(self._pods))]
            seen = self._pods[refusal.uid] = _PodRefusals(first_at=refusal.at)
        seen.count += 1
        key = event_name(refusal)
        seen.reasons[key] = seen.reasons.get(key, 0) + 1
        annotate = not owned_by_controller and seen.annotated != refusal.message
        if annotate:
            seen.annotated = refusal.message
        evict = (owned_by_controller and self.policy.evict and not seen.evicted
                 and seen.count >= self.policy.repeats
                 and refusal.at - seen.first_at >= self.policy.delay_s)
        if evict:
            seen.evicted = True
        return Actions(event_count=seen.reasons[key], first_at=seen.first_at,
                       annotate=annotate, evict=evict)

    def eviction_failed(self, uid: str) -> None:
        """The API server did not evict (a PodDisruptionBudget, an outage): the next refusal
        tries again."""
        if uid in self._pods:
            self._pods[uid].evicted = False


def event_name(refusal: Refusal) -> str:
    """One Event per pod, container and reason, as the kubelet's recorder aggregates them."""
    digest = hashlib.sha256(f"{refusal.uid}/{refusal.container}/{refusal.reason}".encode())
    return f"{refusal.pod[:200]}.nri-numa.{digest.hexdigest()[:12]}"


def controller_of(pod: dict[str, Any]) -> str | None:
    """``Kind/name`` of the pod's controller, None for a bare pod."""
    for owner in pod.get("metadata", {}).get("ownerReferences") or []:
        if owner.get("controller"):
            return f"{owner.get('kind')}/{owner.get('name')}"
    return None


def event_body(refusal: Refusal, actions: Actions, now: float) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name(refusal), "namespace": refusal.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": refusal.namespace,
                           "name": refusal.pod, "uid": refusal.uid,
                           "fieldPath": f"spec.containers{{{refusal.container}}}"},
        "reason": refusal.reason, "message": refusal.message, "type": "Warning",
        "source": {"component": COMPONENT, "host": refusal.node},
        "reportingComponent": COMPONENT, "reportingInstance": refusal.node,
        "count": actions.event_count,
        "firstTimestamp": _rfc3339(actions.first_at), "lastTimestamp": _rfc3339(now),
    }


def _rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodActions:
    """Events, annotations and evictions through the ``kubernetes`` client."""

    def __init__(self, api_client: Any, say: Callable[[dict[str, Any]], None],
                 policy: EvictionPolicy) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._api_client = api_client
        self._say = say
        self.tracker = RefusalTracker(policy)
        self._eviction_version: str | None = None

    def handle(self, message: dict[str, Any]) -> None:
        refusal = Refusal.from_message(message)
        pod = self._api_client.sanitize_for_serialization(self._core.read_namespaced_pod(
            refusal.pod, refusal.namespace, _request_timeout=REQUEST_TIMEOUT))
        if pod.get("metadata", {}).get("uid") != refusal.uid:
            return  # that pod is gone; one of the same name is not the one refused
        controller = controller_of(pod)
        actions = self.tracker.refused(refusal, controller is not None)
        self._event(refusal, actions)
        if actions.annotate:
            self._core.patch_namespaced_pod(
                refusal.pod, refusal.namespace,
                {"metadata": {"annotations": {REFUSED_ANNOTATION: refusal.message}}},
                _request_timeout=REQUEST_TIMEOUT)
        if actions.evict:
            self._evict(refusal, controller or "", actions)

    def degraded(self, message: dict[str, Any]) -> None:
        """One Warning Event on the pod of a degraded container (the agent sends one message
        per container); nothing counted towards an eviction."""
        notice = Refusal.from_message(message)
        pod = self._api_client.sanitize_for_serialization(self._core.read_namespaced_pod(
            notice.pod, notice.namespace, _request_timeout=REQUEST_TIMEOUT))
        if pod.get("metadata", {}).get("uid") != notice.uid:
            return  # that pod is gone
        self._event(notice, Actions(event_count=1, first_at=notice.at))

    def _event(self, refusal: Refusal, actions: Actions) -> None:
        """Create the Event, or raise its count; whichever the other finds missing or there
        (an Event expires after an hour; one may be left from before a restart)."""
        from kubernetes.client.exceptions import ApiException

        body = event_body(refusal, actions, time.time())
        create = actions.event_count == 1
        for _ in range(2):
            try:
                self._create_or_patch_event(refusal.namespace, body, create)
                return
            except ApiException as e:
                if e.status != (409 if create else 404):
                    raise
                create = not create

    def _create_or_patch_event(self, namespace: str, body: dict[str, Any], create: bool) -> None:
        if create:
            self._core.create_namespaced_event(namespace, body, _request_timeout=REQUEST_TIMEOUT)
        else:
            self._core.patch_namespaced_event(
                body["metadata"]["name"], namespace,
                {"count": body["count"], "lastTimestamp": body["lastTimestamp"],
                 "message": body["message"]}, _request_timeout=REQUEST_TIMEOUT)

    def _evict(self, refusal: Refusal, controller: str, actions: Actions) -> None:
        from kubernetes.client.exceptions import ApiException

        body = {"apiVersion": self._eviction_api_version(), "kind": "Eviction",
                "metadata": {"name": refusal.pod, "namespace": refusal.namespace},
                "deleteOptions": {"preconditions": {"uid": refusal.uid}}}
        try:
            self._core.create_namespaced_pod_eviction(refusal.pod, refusal.namespace, body,
                                                      _request_timeout=REQUEST_TIMEOUT)
        except ApiException as e:
            self.tracker.eviction_failed(refusal.uid)
            self._say({"kind": "log", "level": "warning", "message":
                       f"pod {refusal.namespace}/{refusal.pod} not evicted ({e.status} "
                       f"{e.reason}); trying again at its next refusal"})
            return
        text = (f"evicted by nri-numa after {actions.event_count} refusals on node "
                f"{refusal.node}, so that {controller} makes a pod the scheduler can place "
                f"elsewhere: {refusal.message}")
        self._say({"kind": "log", "level": "info",
                   "message": f"pod {refusal.namespace}/{refusal.pod} {text}"})
        evicted = Refusal(refusal.namespace, refusal.pod, refusal.uid, refusal.container,
                          "NriNumaEvicted", text[:1024], refusal.node, refusal.at)
        self._event(evicted, Actions(event_count=1, first_at=time.time()))

    def _eviction_api_version(self) -> str:
        """policy/v1 where the server serves it (Kubernetes 1.22 on), else policy/v1beta1."""
        if self._eviction_version is None:
            from kubernetes import client

            group = client.PolicyApi(self._api_client).get_api_group(
                _request_timeout=REQUEST_TIMEOUT)
            served = {v.version for v in group.versions or ()}
            self._eviction_version = "policy/v1" if "v1" in served else "policy/v1beta1"
        return self._eviction_version


def message_handlers(api_client: Any, say: Callable[[dict[str, Any]], None],
                     policy: EvictionPolicy) -> dict[str, Callable[[dict[str, Any]], None]]:
    """The export process's handlers for the agent's refusal and degraded messages."""
    actions = PodActions(api_client, say, policy)
    return {"refusal": actions.handle, "degraded": actions.degraded}
