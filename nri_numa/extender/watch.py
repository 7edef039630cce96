"""The NodeResourceTopology objects, listed then watched, fed into the cache; the pods as bind
reads, annotates and binds them; and the retries of refused pods when room appears. The only
module of the extender that talks to the API server (the ``kubernetes`` client, the ``cluster``
extra).

Retries: kube-scheduler keeps a pod it could not place in its unschedulable queue until a
cluster event it knows of, or a minute, passes; it knows nothing of NodeResourceTopology
objects. An update to the pod itself moves it back to the active queue at once (1.20's
``PriorityQueue.Update``: any change but its resourceVersion, generation or status). So when a
node's publication frees room, ``Retrier`` writes ``numa.nri.io/retry-for-room`` (what freed room: ``<node>@<generation>``) on each Pending pod filter
refused on that node, once per publication; and when the extender starts, on each Pending pod of
its scheduler that the scheduler tried and could not place (the extender has no memory of the
pods it refused before, and while it was down the scheduler could not ask it).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

from nri_numa.cluster.nrt import GROUP, PLURAL, VERSION
from nri_numa.cluster.nrt_writer import ApiError, call_api
from nri_numa.engine.annotations import RETRY_FOR_ROOM
from nri_numa.extender.cache import NodeCache
from nri_numa.extender.verbs import Extender, RefusedPod

log = logging.getLogger(__name__)

MAX_WAIT = 8.0  # seconds between tries while the API server fails


def watch_forever(api_client: Any, cache: NodeCache, stop: threading.Event) -> None:
    """List every NRT object, then follow the changes; start over (list again, dropping the
    nodes gone meanwhile) whenever the watch ends or fails."""
    from kubernetes import client, watch

    custom = client.CustomObjectsApi(api_client)
    wait = 0.5
    while not stop.is_set():
        try:
            listed = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
            seen = set()
            for obj in listed.get("items", []):
                name = obj["metadata"]["name"]
                seen.add(name)
                cache.observe(name, obj)
            for gone in set(cache.nodes()) - seen:
                cache.forget(gone)
            wait = 0.5
            stream = watch.Watch()
            for event in stream.stream(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                                       resource_version=listed["metadata"]["resourceVersion"],
                                       timeout_seconds=300):
                if stop.is_set():
                    stream.stop()
                    break
                _apply(cache, event)
        except Exception as e:  # noqa: BLE001 - urllib3's ProtocolError and the like: the
            # cache must keep following, whatever ended the stream
            log.warning("NodeResourceTopology watch: %s; trying again in %.1f s",
                        " ".join(str(e).split())[:200], wait)
            stop.wait(wait)
            wait = min(MAX_WAIT, wait * 2)


def _apply(cache: NodeCache, event: Mapping[str, Any]) -> None:
    obj = event.get("object") or {}
    name = (obj.get("metadata") or {}).get("name")
    if event.get("type") == "ERROR" or not isinstance(name, str):
        raise ValueError(f"watch error: {str(obj)[:200]}")
    cache.observe(name, None if event.get("type") == "DELETED" else obj)


class ApiPods:
    """The pods as bind and the retries use them: read, annotate and bind, each write with the
    pod's uid as its precondition (a pod deleted and created again under the same name is
    another pod)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._client = client

    def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            answer = call_api(self._core.read_namespaced_pod, name, namespace,
                              _preload_content=False)
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        return json.loads(answer.data)

    def annotate(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> None:
        # metadata.uid in a merge patch is checked against the pod's (it cannot change).
        call_api(self._core.patch_namespaced_pod, name, namespace,
                 {"metadata": {"uid": uid, "annotations": dict(annotations)}})

    def bind(self, namespace: str, name: str, uid: str, node: str,
             annotations: Mapping[str, str]) -> None:
        c = self._client
        if annotations:
            self.annotate(namespace, name, uid, annotations)
        body = c.V1Binding(metadata=c.V1ObjectMeta(name=name, namespace=namespace, uid=uid),
                           target=c.V1ObjectReference(kind="Node", name=node, api_version="v1"))
        # The client cannot read the Binding's answer (a Status) back into V1Binding.
        call_api(self._core.create_namespaced_pod_binding, name, namespace, body,
                 _preload_content=False)  # pods/binding, as kube-scheduler binds

    def refused_pending(self, scheduler_name: str) -> list[RefusedPod]:
        """The Pending, unbound pods of ``scheduler_name`` that the scheduler tried and could
        not place (for nri-numa's reason, or because no extender answered)."""
        answer = call_api(self._core.list_pod_for_all_namespaces,
                          field_selector="spec.nodeName=,status.phase=Pending",
                          _preload_content=False)
        pods = []
        for item in json.loads(answer.data).get("items") or []:
            meta, spec = item.get("metadata") or {}, item.get("spec") or {}
            if (spec.get("schedulerName") or "default-scheduler") != scheduler_name:
                continue
            conditions = (item.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                   for c in conditions):
                pods.append(RefusedPod(meta.get("namespace", ""), meta.get("name", ""),
                                       meta.get("uid", "")))
        return pods


class Retrier:
    """Has kube-scheduler retry the pods nri-numa refused, when room appears (module doc).
    ``room_freed`` is the cache's ``on_room``: it only queues; one thread does the writes."""

    def __init__(self, pods: ApiPods, extender: Extender) -> None:
        self._pods = pods
        self._extender = extender
        self._queue: queue.SimpleQueue[tuple[str, int] | None] = queue.SimpleQueue()

    def room_freed(self, node: str, generation: int) -> None:
        self._queue.put((node, generation))

    def run(self, stop: threading.Event) -> None:
        try:
            self._retry(self._pods.refused_pending(self._extender.scheduler_name),
                        f"extender start {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
        except Exception as e:  # noqa: BLE001 - the API server's failures have no common type
            log.warning("could not list the Pending pods nri-numa refused: %s",
                        " ".join(str(e).split())[:200])
        while not stop.is_set():
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                continue
            if item is not None:
                node, generation = item
                self._retry(self._extender.take_refused(node), f"{node}@{generation}")

    def _retry(self, refused: list[RefusedPod], reason: str) -> None:
        for pod in refused:
            try:
                live = self._pods.read_pod(pod.namespace, pod.name)
                meta = (live or {}).get("metadata") or {}
                if (live is None or meta.get("uid") != pod.uid
                        or (live.get("spec") or {}).get("nodeName")):
                    continue  # gone, replaced or placed meanwhile
                self._pods.annotate(pod.namespace, pod.name, pod.uid,
                                    {RETRY_FOR_ROOM: reason})
                log.info("pod %s/%s: room freed (%s), scheduling retried",
                         pod.namespace, pod.name, reason)
            except Exception as e:  # noqa: BLE001 - one pod's failure must not stop the rest
                log.warning("pod %s/%s: could not have it retried: %s", pod.namespace, pod.name,
                            " ".join(str(e).split())[:200])


def started(api_client: Any, cache: NodeCache) -> threading.Event:
    """The watch, in a thread of its own; set the event returned to stop it."""
    stop = threading.Event()
    threading.Thread(target=watch_forever, args=(api_client, cache, stop), name="nrt-watch",
                     daemon=True).start()
    return stop


def wait_synced(cache: NodeCache, seconds: float) -> None:
    """Give the first list a moment, so that the first pods are not judged on an empty cache."""
    deadline = time.monotonic() + seconds
    while not cache.nodes() and time.monotonic() < deadline:
        time.sleep(0.1)
