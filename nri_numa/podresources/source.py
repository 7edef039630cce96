"""The kubelet's device hints for one container, for the NRI plugin (docs/podresources.md).

``KubeletDeviceHints(namespace, pod, container)`` asks the kubelet which devices the container
got and returns ``{resource: NUMA nodes}``. It never fails: without the socket, or when the
kubelet does not answer in time, it returns no hints and the plugin places the container on
what the runtime shows. It asks ``Get`` (one pod) and falls back to ``List`` where the kubelet
has no ``Get`` or has it switched off. Nothing is cached across containers but the channel and
what the kubelet supports; a failed call keeps further calls off for a while, so a hung kubelet
costs one deadline, not one per container (a Synchronize adopting many containers would
otherwise run past the runtime's timeout). The one exception is ``one_list()``, a block in which
one ``List`` answers every container: a Synchronize adopting containers that already run.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from nri_numa.podresources.hints import (CdiNodes, DeviceNodes, container_hints, find_container,
                                         pods_by_name)
from nri_numa.topology.model import Topology

if TYPE_CHECKING:
    from nri_numa.podresources.client import PodResourcesClient
    from nri_numa.podresources.pb import api_pb2 as pr

log = logging.getLogger(__name__)

BUDGET_S = 0.15  # for one container, Get and a fallback List together
QUIET_AFTER_FAILURE_S = 10.0  # no calls for this long after one failed
RECHECK_GET_S = 300.0  # ask Get again this long after the kubelet said it has none (upgrades)
WARM_UP_S = 0.5  # at start-up, how long to wait for the kubelet (before registering with NRI)


class KubeletDeviceHints:
    """A hint source: ``(namespace, pod, container) → {resource: frozenset(NUMA nodes)}``."""

    def __init__(self, socket_path: str, topology: Topology, *,
                 cdi_nodes: CdiNodes | None = None, budget_s: float = BUDGET_S,
                 quiet_after_failure_s: float = QUIET_AFTER_FAILURE_S,
                 recheck_get_s: float = RECHECK_GET_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not socket_path:
            raise ValueError("PodResources socket path is empty")
        self.socket_path = socket_path
        self._devices = DeviceNodes(topology)
        self._cdi_nodes = cdi_nodes  # a DRA claim's CDI names -> NUMA nodes
        self._budget_s = budget_s
        self._quiet_s = quiet_after_failure_s
        self._recheck_get_s = recheck_get_s
        self._clock = clock
        self._client: PodResourcesClient | None = None
        self._quiet_until = 0.0
        self._get_off_until = 0.0
        self._failing = False  # a failure was logged; the next success says so
        self._socket_seen: bool | None = None
        self._shared: _SharedList | None = None  # inside one_list()

    def __call__(self, namespace: str, pod: str, container: str) -> dict[str, frozenset[int]]:
        now = self._clock()
        if now < self._quiet_until or not self._socket_present():
            return {}
        try:
            client = self._connect()
            # The budget starts once grpcio is loaded (slow, once; warm_up does it and connects
            # at start-up).
            entry = self._container(client, namespace, pod, container,
                                    self._clock() + self._budget_s)
        except Exception as e:  # noqa: BLE001 - a hint source must never fail a container
            self._failed(e, now)
            return {}
        if self._failing:
            log.info("kubelet PodResources at %s answers again", self.socket_path)
            self._failing = False
        if entry is None:
            log.debug("kubelet lists no container %s in pod %s/%s", container, namespace, pod)
            return {}
        hints = container_hints(entry, self._devices, self._cdi_nodes)
        if hints:
            log.debug("kubelet devices of %s/%s %s: %s", namespace, pod, container,
                      {k: sorted(v) for k, v in hints.items()})
        return hints

    def warm_up(self, timeout_s: float = WARM_UP_S) -> None:
        """Load grpcio and connect now if the socket exists, so that the first container's
        budget pays for neither the import nor the connection."""
        if self._socket_present():
            try:
                self._connect().wait_ready(timeout_s)
            except Exception as e:  # noqa: BLE001 - the calls will say it again, softly
                log.warning("kubelet PodResources client not ready: %s", e)

    @contextmanager
    def one_list(self) -> Iterator[None]:
        """Within this block, on the thread that opened it, the first container asks the
        kubelet for ``List`` and every later one is found in that same answer; on leaving it,
        each container is asked afresh again.

        For a Synchronize adopting the runtime's running containers: the kubelet gave each of
        them its devices at its pod's admission, before the container was created, so one
        answer taken after the Synchronize arrived holds all of them, and 100 containers cost
        one call instead of 100 (even where the kubelet has ``Get``). Not for CreateContainers:
        between two of them the kubelet admits new pods. A nested block uses the outer one's
        answer."""
        if self._shared is not None:
            yield
            return
        self._shared = _SharedList(threading.get_ident())
        try:
            yield
        finally:
            self._shared = None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # --- steps ------------------------------------------------------------------------------

    def _socket_present(self) -> bool:
        present = os.path.exists(self.socket_path)
        if present != self._socket_seen:
            if present:
                log.info("using the kubelet's PodResources API at %s", self.socket_path)
            elif self._socket_seen is not None:
                log.warning("kubelet PodResources socket %s is gone; placing without the "
                            "kubelet's device hints", self.socket_path)
            self._socket_seen = present
        return present

    def _connect(self) -> PodResourcesClient:
        if self._client is None:
            # grpcio is imported here, the first time the socket exists, not at start-up.
            from nri_numa.podresources.client import PodResourcesClient

            self._client = PodResourcesClient(self.socket_path)
        return self._client

    def _container(self, client: PodResourcesClient, namespace: str, pod: str, container: str,
                   deadline: float) -> pr.ContainerResources | None:
        from nri_numa.podresources.client import PodResourcesError

        shared = self._shared
        if shared is not None and shared.thread == threading.get_ident():
            return self._in_shared_list(shared, client, namespace, pod, container, deadline)
        if self._clock() >= self._get_off_until:
            try:
                found = client.get(namespace, pod, timeout_s=deadline - self._clock())
                return find_container([found], namespace, pod, container)
            except PodResourcesError as e:
                if not e.get_unsupported:
                    if "not found" in str(e):
                        return None  # the kubelet does not run this pod (not a Kubernetes pod)
                    raise
                log.info("kubelet has no PodResources Get (%s); using List", e)
                self._get_off_until = self._clock() + self._recheck_get_s
        return client.list_container(namespace, pod, container,
                                     timeout_s=deadline - self._clock())

    def _in_shared_list(self, shared: _SharedList, client: PodResourcesClient, namespace: str,
                        pod: str, container: str, deadline: float
                        ) -> pr.ContainerResources | None:
        if shared.pods is None:
            shared.pods = pods_by_name(client.list(timeout_s=deadline - self._clock()))
            log.debug("one kubelet List of %d pods for the containers to come",
                      sum(map(len, shared.pods.values())))
        return find_container(shared.pods.get((namespace, pod), ()), namespace, pod, container)

    def _failed(self, error: Exception, now: float) -> None:
        self._quiet_until = now + self._quiet_s
        if self._failing:
            log.debug("kubelet PodResources still failing: %s", error)
            return
        self._failing = True
        log.warning("%s; placing without the kubelet's device hints, asking again in %.0f s",
                    error, self._quiet_s)


class _SharedList:
    """The answer ``one_list()`` shares: the kubelet's pods by (namespace, name) once listed."""

    def __init__(self, thread: int) -> None:
        self.thread = thread  # calls from other threads ask afresh
        self.pods: dict[tuple[str, str], list[pr.PodResources]] | None = None


def hint_source(socket_path: str, topology: Topology,
                cdi_nodes: CdiNodes | None = None) -> KubeletDeviceHints | None:
    """The agent's hint source for ``--pod-resources-socket``; None when it is "" (off). A path
    that does not exist yet costs one stat per container until the kubelet creates it.
    ``cdi_nodes``: resolves a DRA claim's CDI names (DeviceLocator.cdi_numa_nodes)."""
    if not socket_path:
        return None
    source = KubeletDeviceHints(socket_path, topology, cdi_nodes=cdi_nodes)
    source.warm_up()
    return source
