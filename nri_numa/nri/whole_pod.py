"""The whole pod at its first container (docs/kubernetes.md, "The whole pod at its first
container").

NRI hands the plugin one container at a time, while the kubelet's pod scope merges the whole
pod's request before its first container runs. Two sources tell the plugin the rest of a pod:

* **The pod's spec from the API server** (``PodSpecs``, fed by the export process's watch of
  this node's pods: nri_numa.cluster.pod_watch): every container with its kind (init,
  restartable sidecar, app) and resources, and whether ``spec.resources`` is set (KEP-2837).
  The pod is then the spec's containers, the one being created as the runtime gives it (its
  devices' NUMA hints included) under the kind the spec gives it. A pod with pod-level
  resources gets no exclusive CPUs and no pinned memory: the kubelet's CPU and Memory Managers
  skip such pods unless the PodLevelResourceManagers gate (alpha in 1.36) is on.
* **The sandbox's resources** (NRI ``PodSandbox.linux.pod_resources``: CRI's
  ``LinuxPodSandboxConfig.resources``, which kubelets from 1.23 fill with
  ``resourcehelper.PodRequests``/``PodLimits`` without the overhead: the init-container and
  sidecar rule applied, pod-level resources where that gate is on). The kubelet writes CPU
  shares (the request), CFS quota and period (the limit) and the memory limit. For a
  Guaranteed pod they are its CPU and memory totals; what the containers created so far do not
  account for becomes one more app container, ``REST_OF_POD`` (no hugepages and no devices: the
  sandbox carries neither). Its CPUs count as exclusive when they are whole, as the kubelet
  counts a container's.

Without either (no API server, a kubelet before 1.23, a pod that is not Guaranteed) the pod is
the containers created so far, as before. ``pod_for_admission`` says which source it used; the
decision line names it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from nri_numa.cluster.pod_watch import MIRROR_ANNOTATION
from nri_numa.engine.request import (ContainerKind, ContainerRequest, PodRequest, QosClass,
                                     RequestError)
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.runtime.to_request import cpu_limit_millicores, cpu_request_millicores, pod_request
from nri_numa.safeio.bounds import clip

log = logging.getLogger(__name__)

FROM_API = "api"  # the API server's pod spec
FROM_SANDBOX = "sandbox"  # the sandbox's resources (CRI)
FROM_SEEN = "seen"  # the containers created so far
SOURCE_WORDS = {FROM_API: "the API server's pod spec", FROM_SANDBOX: "the sandbox's resources",
                FROM_SEEN: "the containers created so far"}
# A name no Kubernetes container can have (names are DNS labels).
REST_OF_POD = "(rest of the pod)"
# How long the first container of a pod the cache does not have yet waits for the watch to
# bring it (the pod's ADDED event and the runtime's CreateContainer race only when the API
# server is slow); later containers never wait.
SPEC_WAIT_S = 0.25


@dataclass(frozen=True)
class SandboxTotals:
    """The pod's totals as the kubelet gave them to the runtime for the sandbox."""

    cpu_millicores: int  # the limit from quota/period, else the request from shares; 0: none
    memory_bytes: int  # the memory limit; 0: none


def sandbox_totals(sandbox: api.PodSandbox) -> SandboxTotals | None:
    """The sandbox's ``linux.pod_resources``; None where the kubelet left them empty."""
    if not sandbox.HasField("linux") or not sandbox.linux.HasField("pod_resources"):
        return None
    resources = sandbox.linux.pod_resources
    cpu, memory = resources.cpu, resources.memory
    limit = cpu_limit_millicores(cpu.quota.value if cpu.HasField("quota") else None,
                                 cpu.period.value if cpu.HasField("period") else None)
    request = cpu_request_millicores(cpu.shares.value if cpu.HasField("shares") else None)
    memory_bytes = memory.limit.value if memory.HasField("limit") else 0
    totals = SandboxTotals(limit or request, max(memory_bytes, 0))
    return totals if totals.cpu_millicores > 0 or totals.memory_bytes > 0 else None


@dataclass(frozen=True)
class PodSpec:
    """What the plugin keeps of a pod's spec: its containers in spec order (init containers,
    sidecars among them, then app containers) and whether it has pod-level resources."""

    uid: str
    namespace: str
    name: str
    containers: tuple[ContainerRequest, ...]
    pod_level_resources: bool = False
    mirror_of: str = ""  # a static pod's uid as the runtime knows it (its mirror's annotation)

    def container(self, name: str) -> ContainerRequest | None:
        return next((c for c in self.containers if c.name == name), None)


def pod_spec_from_api(obj: Mapping[str, Any]) -> PodSpec:
    """A PodSpec from a Pod as the API server returns it (JSON); RequestError naming the field
    when it cannot be read."""
    from nri_numa.engine.manifest import pod_from_manifest  # loaded with the first pod

    if not isinstance(obj, Mapping) or not isinstance(obj.get("spec"), Mapping):
        raise RequestError("spec: missing")
    spec = dict(obj["spec"])
    pod_level = bool(spec.pop("resources", None))
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
    mirror = annotations.get(MIRROR_ANNOTATION, "")
    pod = pod_from_manifest({"metadata": {k: meta[k] for k in ("uid", "namespace", "name")
                                          if k in meta},
                             "spec": spec})
    return PodSpec(pod.uid, pod.namespace, pod.name, pod.containers, pod_level,
                   mirror if isinstance(mirror, str) else "")


class PodSpecs:
    """This node's pods as the API server has them, by uid; fed by the export process's watch
    (``handle``, on the feed's reader thread), read by CreateContainer (``get``). Each call
    holds the lock for a dictionary operation."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._by_uid: dict[str, PodSpec] = {}
        self._synced = False  # a whole list has arrived: a pod missing may be on its way
        self._warned: set[str] = set()

    @property
    def synced(self) -> bool:
        return self._synced

    def __len__(self) -> int:
        return len(self._by_uid)

    def get(self, uid: str, wait_s: float = 0.0) -> PodSpec | None:
        """The pod's spec; when the cache has listed the node's pods but not this one, wait up
        to ``wait_s`` for the watch to bring it."""
        with self._lock:
            found = self._by_uid.get(uid)
            if found is not None or not self._synced or wait_s <= 0:
                return found
            deadline = time.monotonic() + wait_s
            while found is None and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(left)
                found = self._by_uid.get(uid)
            return found

    def handle(self, message: Mapping[str, Any]) -> None:
        """One message of the watch: ``pods`` (the whole list), ``pod`` (added or changed),
        ``pod-gone`` (deleted)."""
        kind = message.get("kind")
        if kind == "pods":
            specs = [s for s in map(self._read, message.get("pods") or []) if s is not None]
            with self._lock:
                first = not self._synced
                self._by_uid = {k: s for s in specs for k in _keys(s)}
                self._synced = True
                self._lock.notify_all()
            if first:
                log.info("this node's pods from the API server: %d listed; pod scope now counts "
                         "the whole pod at its first container", len(specs))
        elif kind == "pod":
            spec = self._read(message.get("pod"))
            if spec is not None:
                with self._lock:
                    for key in _keys(spec):
                        self._by_uid[key] = spec
                    self._lock.notify_all()
        elif kind == "pod-gone":
            uid = message.get("uid")
            with self._lock:
                gone = self._by_uid.pop(uid, None) if isinstance(uid, str) else None
                if gone is not None and gone.mirror_of:
                    self._by_uid.pop(gone.mirror_of, None)

    def _read(self, obj: Any) -> PodSpec | None:
        try:
            return pod_spec_from_api(obj)
        except RequestError as e:
            meta = obj.get("metadata") if isinstance(obj, Mapping) else None
            uid = str((meta or {}).get("uid", "")) if isinstance(meta, Mapping) else ""
            if uid not in self._warned:  # one line per pod, not per update
                self._warned.add(uid)
                log.warning("pod %s from the API server cannot be read (%s): its containers "
                            "are placed as they come", clip(uid) or "?", e)
            return None


def _keys(spec: PodSpec) -> Iterable[str]:
    yield spec.uid
    if spec.mirror_of:
        yield spec.mirror_of


def pod_for_admission(pod: Any, known: Sequence[ContainerRequest], request: ContainerRequest,
                      sandbox: SandboxTotals | None, spec: PodSpec | None
                      ) -> tuple[PodRequest, str]:
    """The pod of ``request`` as the engine should see it, and its source (FROM_API,
    FROM_SANDBOX or FROM_SEEN). ``pod``: the runtime's pod (RuntimePod); ``known``: the
    requests of its containers created before, in creation order; ``spec``: the pod's spec
    from ``PodSpecs`` (looked up by the caller, outside its lock: the lookup may wait)."""
    seen = pod_request(pod, [*known, request])
    if spec is not None and (whole := _from_spec(seen, spec, known, request)) is not None:
        return whole, FROM_API
    if sandbox is not None and seen.qos is QosClass.GUARANTEED:
        return _with_rest(seen, sandbox), FROM_SANDBOX
    return seen, FROM_SEEN


def _from_spec(seen: PodRequest, spec: PodSpec, known: Sequence[ContainerRequest],
               request: ContainerRequest) -> PodRequest | None:
    """The spec's containers, the created ones as the runtime gave them; None when the spec
    does not name the container being created (then the other sources decide)."""
    if spec.container(request.name) is None:
        return None
    created = {c.name: c for c in known}
    created[request.name] = request
    containers = [replace(created[c.name], kind=c.kind) if c.name in created else c
                  for c in spec.containers]
    try:
        return replace(seen, init_containers=tuple(c for c in containers if c.is_init),
                       app_containers=tuple(c for c in containers if not c.is_init),
                       # The kubelet's managers leave a pod with pod-level resources to the
                       # shared pool (module doc): no container of it is Guaranteed to them.
                       qos_override=QosClass.BURSTABLE if spec.pod_level_resources
                       else seen.qos_override)
    except RequestError:  # the runtime's names clash with the spec's: decide as before
        return None


def _with_rest(seen: PodRequest, totals: SandboxTotals) -> PodRequest:
    cpu = totals.cpu_millicores - sum(c.cpu_request for c in seen.containers)
    memory = totals.memory_bytes - sum(c.memory_request for c in seen.containers)
    if cpu <= 0 and memory <= 0:
        return seen
    rest = ContainerRequest(REST_OF_POD, ContainerKind.APP, cpu_request=max(cpu, 0),
                            cpu_limit=max(cpu, 0), memory_request=max(memory, 0),
                            memory_limit=max(memory, 0))
    return replace(seen, app_containers=(*seen.app_containers, rest))
