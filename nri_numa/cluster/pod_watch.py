"""The export process's watch of this node's pods: their specs, for the whole pod at its first
container (nri_numa.nri.whole_pod; docs/kubernetes.md, "The whole pod at its first container").

Lists the pods bound to the node (``spec.nodeName``, as the kubelet selects its own), then
follows them; starts over (list again) whenever the watch ends or fails, with waits from 0.5 s
doubling to 8 s while the API server fails. The agent is told:

* ``{"kind": "pods", "pods": [...]}``: every pod of the node (after each list);
* ``{"kind": "pod", "pod": {...}}``: a pod added, or one whose containers or resources changed
  (status updates, most of a pod's events, are not passed on);
* ``{"kind": "pod-gone", "uid": ...}``: a pod deleted.

A pod is sent as the part of it the agent reads: metadata (uid, namespace, name, the static
pod's mirror annotation) and, per container, its name, resources and restartPolicy, plus the
pod-level ``spec.resources``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

MAX_WAIT = 8.0
WATCH_TIMEOUT_S = 300  # the server ends a watch after this; a new list follows
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_CONTAINER_KEYS = ("name", "resources", "restartPolicy")

Say = Callable[[dict[str, Any]], None]


def pod_shape(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a Pod (API JSON) the agent reads."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    shape_meta = {k: meta[k] for k in ("uid", "namespace", "name") if k in meta}
    mirror = (meta.get("annotations") or {}).get(MIRROR_ANNOTATION)
    if mirror:
        shape_meta["annotations"] = {MIRROR_ANNOTATION: mirror}
    shape_spec: dict[str, Any] = {
        key: [{k: c[k] for k in _CONTAINER_KEYS if k in c} for c in spec.get(key) or []
              if isinstance(c, Mapping)]
        for key in ("initContainers", "containers")}
    if spec.get("resources"):
        shape_spec["resources"] = spec["resources"]
    return {"metadata": shape_meta, "spec": shape_spec}


class PodWatch:
    """Lists and watches the node's pods through ``core`` (a kubernetes CoreV1Api), telling
    ``say``; ``run`` returns when ``stop`` is set."""

    def __init__(self, core: Any, node: str, say: Say, stop: threading.Event) -> None:
        self._core = core
        self._selector = f"spec.nodeName={node}"
        self._say = say
        self._stop = stop
        self._sent: dict[str, dict[str, Any]] = {}  # uid -> the shape the agent has
        self._failing = False

    def run(self) -> None:
        wait = 0.5
        while not self._stop.is_set():
            try:
                version = self.list_all()
                if self._failing:
                    self._log("info", "pod watch: the API server answers again")
                    self._failing = False
                wait = 0.5
                self.follow(version)
            except Exception as e:  # noqa: BLE001 - urllib3's ProtocolError, ApiException...
                if not self._failing:  # one line when it starts failing, not per retry
                    self._log("warning", f"pod watch: {' '.join(str(e).split())[:300]}; pods "
                              f"are placed as their containers come until it works again "
                              f"(retrying with waits up to {MAX_WAIT:.0f} s)")
                    self._failing = True
                self._stop.wait(wait)
                wait = min(MAX_WAIT, wait * 2)

    def list_all(self) -> str:
        """Every pod of the node, sent as one message; the list's resourceVersion."""
        answer = self._core.list_pod_for_all_namespaces(field_selector=self._selector,
                                                        _preload_content=False,
                                                        _request_timeout=30)
        listed = json.loads(answer.data)
        shapes = [pod_shape(p) for p in listed.get("items") or []]
        self._sent = {s["metadata"].get("uid", ""): s for s in shapes}
        self._say({"kind": "pods", "pods": shapes})
        return (listed.get("metadata") or {}).get("resourceVersion", "")

    def follow(self, version: str) -> None:
        from kubernetes import watch

        stream = watch.Watch()
        for event in stream.stream(self._core.list_pod_for_all_namespaces,
                                   field_selector=self._selector, resource_version=version,
                                   timeout_seconds=WATCH_TIMEOUT_S,
                                   _request_timeout=WATCH_TIMEOUT_S + 30):
            if self._stop.is_set():
                stream.stop()
                return
            self.apply(event.get("type"), event.get("raw_object") or {})

    def apply(self, kind: str | None, obj: Mapping[str, Any]) -> None:
        if kind == "ERROR":  # a resourceVersion too old, mostly: list again
            raise ValueError(f"watch error: {str(obj.get('message', obj))[:200]}")
        uid = (obj.get("metadata") or {}).get("uid")
        if not isinstance(uid, str):
            return
        if kind == "DELETED":
            if self._sent.pop(uid, None) is not None:
                self._say({"kind": "pod-gone", "uid": uid})
            return
        shape = pod_shape(obj)
        if self._sent.get(uid) != shape:
            self._sent[uid] = shape
            self._say({"kind": "pod", "pod": shape})

    def _log(self, level: str, text: str) -> None:
        self._say({"kind": "log", "level": level, "message": text})


def started(api_client: Any, node: str, say: Say) -> threading.Event:
    """The watch in a thread of its own; set the event returned to stop it."""
    from kubernetes import client

    stop = threading.Event()
    watcher = PodWatch(client.CoreV1Api(api_client), node, say, stop)
    threading.Thread(target=watcher.run, name="pod-watch", daemon=True).start()
    return stop
