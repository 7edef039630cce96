"""The NodeResourceTopology objects, listed then watched, fed into the cache; and the binder that
records the chosen NUMA nodes on the pod and binds it. The only module of the extender that
talks to the API server (the ``kubernetes`` client, the ``cluster`` extra)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from nri_numa.cluster.nrt import GROUP, PLURAL, VERSION
from nri_numa.extender.cache import NodeCache

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


class ApiBinder:
    """Patches the chosen NUMA nodes onto the pod, then creates its Binding."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._client = client

    def __call__(self, namespace: str, name: str, uid: str, node: str,
                 annotations: Mapping[str, str]) -> None:
        c = self._client
        if annotations:
            self._core.patch_namespaced_pod(name, namespace,
                                            {"metadata": {"annotations": dict(annotations)}})
        body = c.V1Binding(metadata=c.V1ObjectMeta(name=name, namespace=namespace, uid=uid),
                           target=c.V1ObjectReference(kind="Node", name=node, api_version="v1"))
        # The client cannot read the Binding's answer (a Status) back into V1Binding.
        self._core.create_namespaced_binding(namespace, body, _preload_content=False)


def started(api_client: Any, cache: NodeCache) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=watch_forever, args=(api_client, cache, stop),
                              name="nrt-watch", daemon=True)
    thread.start()
    return thread, stop


def wait_synced(cache: NodeCache, seconds: float) -> None:
    """Give the first list a moment, so that the first pods are not judged on an empty cache."""
    deadline = time.monotonic() + seconds
    while not cache.nodes() and time.monotonic() < deadline:
        time.sleep(0.1)
