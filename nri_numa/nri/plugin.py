"""The NRI plugin: one small handler per runtime event, around the ledger.

Every handler decides in memory, commits to the ledger, writes the checkpoint, and only then
answers (docs/nri-plugin.md). Changes to *other* containers' cpusets (the shared pool shrinking
or growing) go back in the same reply wherever the message has room for updates; the events
whose reply is empty (RemoveContainer, StopPodSandbox, RemovePodSandbox) hand them to
``send_updates``, which the daemon sends after the handler has returned — never from inside a
handler, where the runtime would deadlock (docs/nri-wire.md §6).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from nri_numa.engine.admit import admit
from nri_numa.engine.allocations import AllocationsError, ContainerAllocation
from nri_numa.engine.annotations import AnnotationError
from nri_numa.engine.config import ConfigError, EngineConfig
from nri_numa.engine.context import EngineContext
from nri_numa.engine.decision import Placement
from nri_numa.engine.request import ContainerRequest, PodRequest, RequestError, guaranteed_cpus
from nri_numa.inputs import InputFileError, NotYamlError, config_document
from nri_numa.logs import decision_fields, refusal_fields
from nri_numa.metrics import NO_METRICS, NoMetrics, PluginMetrics
from nri_numa.nri import translate
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.session import PluginError
from nri_numa.runtime import (DeviceGranter, DeviceLocator, GrantError, RuntimeContainer,
                              RuntimeInputError, RuntimePod, container_request, pod_identity,
                              pod_qos, pod_request, requested_devices)
from nri_numa.state.checkpoint import (CheckpointError, CheckpointStore, ContainerRecord,
                                       PodRecord, RecordError, records_from_dict)
from nri_numa.state.encoding import Encoded, LedgerEncoder, RecordsEncoder, canonical
from nri_numa.state.ledger import Ledger, LedgerError
from nri_numa.state.recorded_config import (PAYLOAD_KEY, RecordedConfig,
                                            checkpoint_config_matches, refuse_change)
from nri_numa.topology.cpulist import format_list
from nri_numa.topology.model import Topology

log = logging.getLogger(__name__)

SendUpdates = Callable[[list[api.ContainerUpdate]], None]


class NumaPlugin:
    """The handlers of ``nri_numa.nri.session.PluginHandlers``; one event at a time."""

    def __init__(self, topology: Topology, config: EngineConfig,
                 store: CheckpointStore | None = None, *,
                 locator: DeviceLocator | None = None,
                 send_updates: SendUpdates | None = None,
                 kubelet_hints: Callable[[str, str, str], dict[str, frozenset[int]]] | None = None,
                 granter: DeviceGranter | None = None,
                 metrics: PluginMetrics | NoMetrics = NO_METRICS,
                 ) -> None:
        self._topology = topology
        self._granter = granter or DeviceGranter(topology)  # devices → nodes, rules, env
        # (namespace, pod, container) → the kubelet's devices' NUMA nodes (PodResources API).
        self._kubelet_hints = kubelet_hints or (lambda namespace, pod, container: {})
        self._ledger = Ledger(EngineContext.build(topology, config))
        self._store = store
        self._locator = locator or DeviceLocator(topology)
        self._send_updates = send_updates or (lambda updates: None)
        self._metrics = metrics
        self._lock = threading.Lock()
        self._pods: dict[str, PodRecord] = {}  # by sandbox id
        self._containers: dict[str, ContainerRecord] = {}  # by container id, creation order
        self._ledger_json, self._records_json = LedgerEncoder(), RecordsEncoder()
        self._config_json = _config_json(self._ledger.ctx)
        self._restore()

    # --- read-only views ----------------------------------------------------------------------

    @property
    def ledger(self) -> Ledger:
        return self._ledger

    @property
    def containers(self) -> dict[str, ContainerRecord]:
        return dict(self._containers)

    # --- handlers --------------------------------------------------------------------------

    def configure(self, req: api.ConfigureRequest) -> api.ConfigureResponse:
        log.info("configured by %s %s", req.runtime_name or "runtime", req.runtime_version)
        if req.config.strip():
            with self._lock:
                self._reconfigure(_config_from_text(req.config))
        return api.ConfigureResponse(events=translate.EVENT_MASK)

    def synchronize(self, req: api.SynchronizeRequest) -> api.SynchronizeResponse:
        live, live_ids, problems = translate.live_containers(req)
        for problem in problems:
            log.warning("synchronize: %s", problem)
        with self._lock, self._transaction():
            self._release_missing(live_ids)
            for container in live:
                if container.id not in self._containers:
                    self._adopt(container)
            updates = self._restore_cpusets({c.id: c for c in live})
        log.info("synchronized: %d containers managed, shared pool %s, %d updates",
                 len(self._containers), format_list(self._shared()), len(updates))
        return api.SynchronizeResponse(update=updates)

    def create_container(self, req: api.CreateContainerRequest) -> api.CreateContainerResponse:
        with self._metrics.admission():
            container = self._translate(req.pod, req.container)
            with self._lock, self._transaction():
                placement = self._admit(container)
                adjust = self._adjustment(placement)
                updates = self._shared_updates(skip=container.id)
        return api.CreateContainerResponse(adjust=adjust, update=updates)

    def update_container(self, req: api.UpdateContainerRequest) -> api.UpdateContainerResponse:
        with self._lock:
            record = self._containers.get(req.container.id)
            if record is None:
                return api.UpdateContainerResponse()
            cpus = record.cpus if record.exclusive else self._shared()
        # The runtime merges this into the update it is applying: our cpuset stays.
        return api.UpdateContainerResponse(update=[translate.cpuset_update(
            record.id, cpus, record.mems, ignore_failure=False)])

    def stop_container(self, req: api.StopContainerRequest) -> api.StopContainerResponse:
        with self._lock:
            updates = self._release([req.container.id])
        return api.StopContainerResponse(update=updates)

    def state_change(self, event: api.StateChangeEvent) -> None:
        with self._lock:
            if event.event == api.REMOVE_CONTAINER:
                ids = [event.container.id]
            elif event.event in (api.STOP_POD_SANDBOX, api.REMOVE_POD_SANDBOX):
                ids = [c.id for c in self._containers.values() if c.sandbox_id == event.pod.id]
            else:
                return
            updates = self._release(ids)
        if updates:
            self._send_updates(updates)

    def shutdown(self) -> None:
        log.info("runtime asked nri-numa to shut down")

    # --- admission --------------------------------------------------------------------------

    def _translate(self, pod: api.PodSandbox, container: api.Container) -> RuntimeContainer:
        try:
            return translate.runtime_container(container, translate.runtime_pod(pod))
        except RuntimeInputError as e:
            raise PluginError(f"nri-numa: cannot read container {container.id}: {e}") from None

    def _admit(self, container: RuntimeContainer) -> Placement:
        """Place ``container``; PluginError with the engine's reason when it does not fit."""
        pod, request = self._pod_and_request(container)
        request = self._with_requested_devices(container, pod, request)
        pod_req = self._pod_request(pod, request)
        try:
            result = self._ledger.admit(pod_req, [request.name])
        except (RequestError, ValueError) as e:
            log.info("refused %s: %s", _describe(pod, request.name), e, extra=refusal_fields(
                _pod_name(pod), pod.uid, request.name, container.id, None, "RequestError", None,
                str(e)))
            raise PluginError(f"nri-numa: {_describe(pod, request.name)}: {e}") from None
        self._metrics.decided(self._ledger.ctx, pod_req, request, result.decision)
        rejection = result.decision.rejection
        if rejection is not None:
            # One line, led by the kubelet's reason, as the kubelet would show it.
            text = rejection.message
            if not text.startswith(rejection.reason):
                text = f"{rejection.reason}: {text}"
            log.info("refused %s: %s", _describe(pod, request.name), text, extra=refusal_fields(
                _pod_name(pod), pod.uid, request.name, container.id, rejection.policy,
                rejection.reason, rejection.resource, text))
            raise PluginError(f"nri-numa: {text}")
        placement = result.decision.placements[0]
        self._remember(container, pod, request, placement)
        _log_decision(pod, result.decision.policy, placement, container.id)
        return placement

    def _with_requested_devices(self, container: RuntimeContainer, pod: PodRecord,
                                request: ContainerRequest) -> ContainerRequest:
        """The request plus the devices of the container's own ``numa.nri.io/devices`` (the
        pod's ``numa.nri.io/devices.<container>`` is the engine's, docs/devices.md)."""
        ctx = self._ledger.ctx
        try:
            devices = requested_devices(container, ctx.devices, ctx.device_classes)
        except AnnotationError as e:
            raise PluginError(f"nri-numa: InvalidAnnotation: {_describe(pod, request.name)}: "
                              f"{e}") from None
        return replace(request, devices=devices) if devices else request

    def _adjustment(self, placement: Placement) -> api.ContainerAdjustment:
        """The container's adjustment; PluginError (undoing the placement) when a device it
        was given cannot be handed over."""
        try:
            return translate.adjustment(placement, self._granter.grant(placement.devices))
        except GrantError as e:
            raise PluginError(f"nri-numa: container {placement.container}: {e}") from None

    def _adopt(self, container: RuntimeContainer) -> None:
        """A running container we did not place: keep its CPUs when they are already
        exclusive and free, else place it; one that does not fit only follows the shared pool."""
        pod, request = self._pod_and_request(container)
        pod_req = self._pod_request(pod, request)
        placement = self._adopt_in_place(pod_req, request, container.cpuset_cpus)
        if placement is not None:
            log.info("adopted %s on its own CPUs %s", _describe(pod, request.name),
                     format_list(placement.cpus))
            self._remember(container, pod, request, placement)
            return
        try:
            result = self._ledger.admit(pod_req, [request.name])
            reason = result.decision.rejection and result.decision.rejection.message
        except (RequestError, ValueError) as e:
            reason = str(e)
        if reason:
            log.warning("running %s does not fit (%s); it stays in the shared pool",
                        _describe(pod, request.name), reason)
            self._containers[container.id] = ContainerRecord(
                container.id, pod.sandbox_id, pod.uid, request,
                container.cpuset_cpus or frozenset(), exclusive=False, in_ledger=False)
            return
        placement = result.decision.placements[0]
        _log_decision(pod, result.decision.policy, placement, container.id, "adopted")
        self._remember(container, pod, request, placement)

    def _adopt_in_place(self, pod: PodRequest, request: ContainerRequest,
                        cpus: frozenset[int] | None) -> Placement | None:
        """Admit a Guaranteed container on the CPUs it runs on, when they are as many as it
        asks for, all free and none reserved; None when it cannot stay where it is."""
        ctx, allocs = self._ledger.ctx, self._ledger.allocations
        count = guaranteed_cpus(pod, request) if ctx.cpu_static else 0
        if (not count or not cpus or len(cpus) != count or not cpus < allocs.shared
                or cpus & ctx.reserved_cpus):
            return None
        # Seeded as already held, the engine checks the CPUs against the policy and places
        # memory and devices around them instead of picking new CPUs.
        held = allocs.pod(pod.uid).with_container(request.name, ContainerAllocation(cpus))
        seeded = allocs.with_pod(pod.uid, held).with_shared(allocs.shared - cpus)
        result = admit(ctx, seeded, pod, [request.name])
        if not result.decision.admitted:
            return None
        try:
            ctx.check(result.allocations)
        except AllocationsError:
            return None
        self._ledger = Ledger(ctx, result.allocations)
        return result.decision.placements[0]

    def _pod_and_request(self, container: RuntimeContainer) -> tuple[PodRecord, ContainerRequest]:
        uid, namespace, name = pod_identity(container.pod)
        pod = PodRecord(container.pod.id, uid, namespace, name, container.pod.cgroup_parent,
                        container.pod.annotations)
        self._pods[pod.sandbox_id] = pod
        request = container_request(container, pod_qos(container.pod), {
            **self._locator.numa_hints(container),  # the kubelet's word wins: it chose them
            **self._kubelet_hints(namespace, name, container.name)})
        self._forget_stale(pod, request.name, container.id)
        return pod, request

    def _pod_request(self, pod: PodRecord, request: ContainerRequest) -> PodRequest:
        """The pod as far as it is known: its placed containers in creation order, then this."""
        known = [c.request for c in self._containers.values()
                 if c.sandbox_id == pod.sandbox_id and c.name != request.name]
        runtime_pod = RuntimePod(id=pod.sandbox_id, uid=pod.uid, name=pod.name,
                                 namespace=pod.namespace, cgroup_parent=pod.cgroup_parent,
                                 annotations=pod.annotations)
        return pod_request(runtime_pod, [*known, request])

    def _forget_stale(self, pod: PodRecord, name: str, container_id: str) -> None:
        # A pod runs one container per name: an older one of that name has exited (its stop
        # may have been missed while we were away), so what it held is free again.
        for stale in [c for c in self._containers.values() if c.sandbox_id == pod.sandbox_id
                      and c.name == name and c.id != container_id]:
            del self._containers[stale.id]
            if stale.in_ledger:
                self._ledger.release(stale.pod_uid, stale.name)

    def _remember(self, container: RuntimeContainer, pod: PodRecord, request: ContainerRequest,
                  placement: Placement) -> None:
        self._containers[container.id] = ContainerRecord(
            container.id, pod.sandbox_id, pod.uid, request, placement.cpus,
            placement.exclusive, placement.mems)

    # --- release and cpusets ----------------------------------------------------------------

    def _release(self, ids: Sequence[str]) -> list[api.ContainerUpdate]:
        """Release containers; a failed write keeps the release: the file then holds more
        than is in use, which is safe."""
        released = [self._containers.pop(i) for i in ids if i in self._containers]
        if not released:
            return []
        for record in released:
            if record.in_ledger:
                self._ledger.release(record.pod_uid, record.name)
            log.info("released container %s (%s) of pod %s", record.name, record.id,
                     record.pod_uid)
        self._drop_orphans()
        updates = self._shared_updates()
        try:
            self._persist()
        except CheckpointError as e:
            log.error("state not saved after a release (kept in memory): %s", e)
        return updates

    def _release_missing(self, live_ids: set[str]) -> None:
        gone = [cid for cid in self._containers if cid not in live_ids]
        for cid in gone:
            record = self._containers.pop(cid)
            if record.in_ledger:
                self._ledger.release(record.pod_uid, record.name)
            log.info("container %s (%s) is gone: released", record.name, cid)
        self._drop_orphans()

    def _drop_orphans(self) -> None:
        """Pods with no container left, and ledger entries no record explains."""
        in_use = {c.sandbox_id for c in self._containers.values()}
        self._pods = {k: p for k, p in self._pods.items() if k in in_use}
        placed = {(c.pod_uid, c.name) for c in self._containers.values() if c.in_ledger}
        for uid, pod_alloc in self._ledger.allocations.pods.items():
            for name in list(pod_alloc.containers):
                if (uid, name) not in placed:
                    self._ledger.release(uid, name)

    def _shared(self) -> frozenset[int]:
        return self._ledger.allocations.shared

    def _shared_updates(self, skip: str | None = None) -> list[api.ContainerUpdate]:
        """Move every shared container we manage whose cpuset is not the shared pool now."""
        shared = self._shared()
        updates = []
        for record in list(self._containers.values()):
            if record.exclusive or record.id == skip or record.cpus == shared:
                continue
            updates.append(translate.cpuset_update(record.id, shared))
            self._containers[record.id] = _with_cpus(record, shared)
        return updates

    def _restore_cpusets(self, live: dict[str, RuntimeContainer]) -> list[api.ContainerUpdate]:
        """Synchronize's updates: each container onto the cpuset we expect, from what the
        runtime says it has now; a differing exclusive container is logged as drift."""
        shared, online = self._shared(), self._topology.online_cpus
        updates = []
        for record in list(self._containers.values()):
            expected = record.cpus if record.exclusive else shared
            if record.id not in live:
                continue  # unreadable: nothing to compare with
            # No cpuset from the runtime: the container may use every CPU.
            actual = live[record.id].cpuset_cpus or online
            if actual == expected:
                continue
            if record.exclusive:
                log.warning("drift: container %s (%s) runs on CPUs %s, expected %s; restoring",
                            record.name, record.id, format_list(actual), format_list(expected))
            updates.append(translate.cpuset_update(record.id, expected, record.mems))
            self._containers[record.id] = _with_cpus(record, expected)
        return updates

    # --- configuration and persistence ------------------------------------------------------

    def _reconfigure(self, config: EngineConfig) -> None:
        if config == self._ledger.ctx.config:
            return
        try:
            ctx = EngineContext.build(self._topology, config)
        except ConfigError as e:
            raise PluginError(f"nri-numa: configuration does not fit this machine: {e}") from None
        # As at start-up (_restore): placements made under other policies are not carried over.
        live = len(self._containers)
        changes = _recorded(self._ledger.ctx).changes_to(_recorded(ctx))
        where = self._store.path if self._store is not None else "the plugin's state"
        if live and changes:
            raise PluginError(f"nri-numa: {refuse_change(where, changes, live)}")
        try:
            self._ledger = Ledger.restore(ctx, self._ledger.to_dict())
        except LedgerError as e:
            if live:
                raise PluginError(f"nri-numa: {refuse_change(where, [str(e)], live)}") from None
            self._ledger = Ledger(ctx)
            self._pods.clear()
        self._config_json = _config_json(ctx)
        log.info("configuration from the runtime: topology policy %s, CPU manager %s",
                 config.topology_manager_policy, config.cpu_manager_policy)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """Everything inside commits and is written to disk, or none of it happened."""
        saved = (self._ledger.allocations, dict(self._pods), dict(self._containers))
        try:
            yield
            self._persist()
        except BaseException as e:
            allocations, self._pods, self._containers = saved
            self._ledger = Ledger(self._ledger.ctx, allocations)
            if isinstance(e, CheckpointError):
                raise PluginError(f"nri-numa: cannot save state, nothing changed: {e}") from None
            raise

    def _persist(self) -> None:
        if self._store is not None:
            self._store.save({"ledger": self._ledger_json.encode(self._ledger),
                              "records": self._records_json.encode(self._pods, self._containers),
                              PAYLOAD_KEY: self._config_json})

    def _restore(self) -> None:
        if self._store is None or (payload := self._store.load()) is None:
            return
        try:
            pods, containers = records_from_dict(payload.get("records"))
            if not checkpoint_config_matches(self._store, payload, _recorded(self._ledger.ctx),
                                             len(containers)):
                return
            ledger = Ledger.restore(self._ledger.ctx, payload.get("ledger"))
            for c in containers.values():
                if c.in_ledger and ledger.allocations.container(c.pod_uid, c.name) is None:
                    raise RecordError(f"container {c.id} is not in the ledger")
        except (LedgerError, RecordError) as e:
            self._store.set_aside(str(e))
            return
        self._ledger, self._pods, self._containers = ledger, pods, containers
        log.info("restored %d containers from %s", len(containers), self._store.path)



def _recorded(ctx: EngineContext) -> RecordedConfig:
    return RecordedConfig.of(ctx.config, ctx.reserved_cpus)


def _config_json(ctx: EngineContext) -> Encoded:
    return Encoded(canonical(_recorded(ctx).to_dict()))  # the same each time: encoded once


def _with_cpus(record: ContainerRecord, cpus: frozenset[int]) -> ContainerRecord:
    return ContainerRecord(record.id, record.sandbox_id, record.pod_uid, record.request, cpus,
                           record.exclusive, record.mems, record.in_ledger)


def _config_from_text(text: str) -> EngineConfig:
    try:
        document = config_document(text, "plugin configuration")
    except NotYamlError as e:
        raise PluginError(f"nri-numa: plugin configuration is not YAML: {e}") from None
    except InputFileError as e:
        raise PluginError(f"nri-numa: bad plugin configuration: {e}") from None
    if document.settings is not None:
        log.warning("the runtime's plugin configuration has a nriNuma map: ignored, the agent's "
                    "settings come from its --config file and command line")
    return document.engine


def _describe(pod: PodRecord, container: str) -> str:
    return f"pod {_pod_name(pod)} container {container}"


def _pod_name(pod: PodRecord) -> str:
    return f"{pod.namespace}/{pod.name}"


def _log_decision(pod: PodRecord, policy: str, placement: Placement, container_id: str,
                  event: str = "placed") -> None:
    hint = placement.hint
    nodes = "any" if hint.affinity is None else format_list(hint.affinity)
    log.info("%s %s: policy %s, hint NUMA %s%s, cpus %s (%s), mems %s", event,
             _describe(pod, placement.container), policy, nodes,
             " (preferred)" if hint.preferred else "", format_list(placement.cpus),
             "exclusive" if placement.exclusive else "shared",
             "unchanged" if placement.mems is None else format_list(placement.mems),
             extra=decision_fields(event, _pod_name(pod), pod.uid, container_id, policy,
                                   placement))
