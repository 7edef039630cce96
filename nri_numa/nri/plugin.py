"""The NRI plugin: one small handler per runtime event, around the plugin's records.

Every handler decides in memory, commits to the ledger, writes the checkpoint, and only then
answers (docs/nri-plugin.md). Changes to *other* containers' cpusets (the shared pool shrinking
or growing) go back in the same reply wherever the message has room for updates; the events
whose reply is empty (RemoveContainer, StopPodSandbox, RemovePodSandbox) hand them to
``send_updates``, which the daemon sends after the handler has returned — never from inside a
handler, where the runtime would deadlock (docs/nri-protocol.md §6).

Around the handlers: nri_numa.state.plugin_records (the ledger and the records, changed
together), translate.py (NRI messages → a container, its pod's record and the engine's
request; placements → replies), sync.py (Synchronize's adoption),
promotion.py (adopted containers that did not fit, placed once room appears), persistence.py
(the checkpoint and the transaction), decision_log.py (the decision lines).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

from nri_numa.agent.inputs import InputFileError, NotYamlError, config_document
from nri_numa.agent.metrics import NO_METRICS, NoMetrics, PluginMetrics
from nri_numa.engine.allocations import Allocations
from nri_numa.engine.config import ConfigError, EngineConfig
from nri_numa.engine.context import EngineContext
from nri_numa.engine.decision import Placement
from nri_numa.engine.request import RequestError
from nri_numa.nri import decision_log, dra_cpu, promotion, resize, sync, translate, whole_pod
from nri_numa.nri.decision_log import log
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.persistence import StateFile, recorded
from nri_numa.nri.session import PluginError
from nri_numa.nri.start_check import Cpuset, StartCheck
from nri_numa.nri.translate import KubeletHints, RequestReader
from nri_numa.runtime import (DeviceGranter, DeviceLocator, GrantError, RuntimeContainer,
                              pod_identity)
from nri_numa.state.checkpoint import CheckpointError, CheckpointStore
from nri_numa.state.kubelet_checkpoints import KubeletPlacements
from nri_numa.state.ledger import Ledger, LedgerError, LedgerReader
from nri_numa.state.plugin_records import ContainerRecord, PodRecord, Records
from nri_numa.state.recorded_config import refuse_change
from nri_numa.topology.cpulist import format_list
from nri_numa.topology.model import Topology

SendUpdates = Callable[[list[api.ContainerUpdate]], None]
# (pod, container name, the engine's reason, the one line the runtime is told)
OnRefusal = Callable[[PodRecord, str, str, str], None]
# (pod, container name, one line saying why it runs without its exclusive CPUs)
OnDegraded = Callable[[PodRecord, str, str], None]


class NumaPlugin:
    """The handlers of ``nri_numa.nri.session.PluginHandlers``; one event at a time."""

    def __init__(self, topology: Topology, config: EngineConfig,
                 store: CheckpointStore | None = None, *,
                 locator: DeviceLocator | None = None,
                 send_updates: SendUpdates | None = None,
                 kubelet_hints: KubeletHints | None = None,
                 granter: DeviceGranter | None = None,
                 metrics: PluginMetrics | NoMetrics = NO_METRICS,
                 cgroup_root: Path | None = None,
                 on_change: Callable[[], None] | None = None,
                 on_refusal: OnRefusal | None = None,
                 kubelet_state: KubeletPlacements | None = None,
                 on_degraded: OnDegraded | None = None,
                 pod_specs: PodSpecs | None = None,
                 ) -> None:
        self._topology = topology
        self._granter = granter or DeviceGranter(topology)  # devices → nodes, rules, env
        self._reader = RequestReader(locator or DeviceLocator(topology),
                                     kubelet_hints or (lambda namespace, pod, container: {}))
        # A Synchronize's adoptions share one kubelet answer (KubeletDeviceHints.one_list).
        self._one_kubelet_answer = getattr(kubelet_hints, "one_list", nullcontext)
        self._send_updates = send_updates or (lambda updates: None)
        # Told after every committed change (the NodeResourceTopology export); must not block.
        self._on_change = on_change or (lambda: None)
        # Told of every container refused (the cluster's Event and eviction); must not block.
        self._on_refusal = on_refusal or (lambda pod, container, reason, text: None)
        # Told once per degraded container (nri_numa.nri.promotion; the pod's Warning Event);
        # must not block. ``_warned``: the containers told of, while they stay degraded.
        self._on_degraded = on_degraded or (lambda pod, container, text: None)
        self._warned: set[str] = set()
        self._metrics = metrics
        # This node's pods from the API server (nri_numa.nri.whole_pod); None: not known.
        self._pod_specs = pod_specs
        self._starts = StartCheck(cgroup_root)  # None: compare with the creation only
        # The kubelet's CPU and Memory Manager checkpoints, for the first Synchronize only: moving
        # a node from the kubelet's static policies keeps running containers where it put them.
        self._kubelet_state = kubelet_state
        self._lock = threading.Lock()
        ctx = EngineContext.build(topology, config)
        self._state_file = StateFile(store, ctx)
        self._records = self._state_file.restore(ctx) or Records(Ledger(ctx))
        self._degraded_count = 0  # for the gauge, which never takes the lock
        self._count_degraded()

    # --- read-only views ----------------------------------------------------------------------

    @property
    def ledger(self) -> LedgerReader:
        return self._records.ledger

    @property
    def containers(self) -> dict[str, ContainerRecord]:
        return dict(self._records.containers)

    @property
    def degraded_count(self) -> int:
        """Degraded containers (nri_numa.nri.promotion) as of the last committed change."""
        return self._degraded_count

    def committed(self) -> tuple[EngineContext, Allocations]:
        """The ledger's context and allocations as last committed, never mid-transaction."""
        with self._lock:
            ledger = self._records.ledger
            return ledger.ctx, ledger.allocations

    # --- handlers --------------------------------------------------------------------------

    def configure(self, req: api.ConfigureRequest) -> api.ConfigureResponse:
        log.info("configured by %s %s", req.runtime_name or "runtime", req.runtime_version)
        log.info("%s", self._granter.use_runtime(req.runtime_name, req.runtime_version))
        if req.config.strip():
            with self._lock:
                self._reconfigure(_config_from_text(req.config))
        return api.ConfigureResponse(events=translate.EVENT_MASK)

    def synchronize(self, req: api.SynchronizeRequest) -> api.SynchronizeResponse:
        live, live_ids, problems = translate.live_containers(req)
        for problem in problems:
            log.warning("synchronize: %s", problem)
        records = self._records
        with self._lock, self._transaction(), self._one_kubelet_answer():
            sync.release_missing(records, live_ids)
            kubelet, self._kubelet_state = self._kubelet_state or KubeletPlacements(), None
            for container in sync.to_adopt(records, self._reader, live):
                uid, name = container.pod.uid, container.name
                sync.adopt(records, self._reader, container,
                           kubelet.cpus_of(uid, name, container.id), kubelet.memory_of(uid, name))
            # After the adoptions: a container already on free exclusive CPUs keeps them.
            promoted = {p.record.id for p in promotion.promote(records)}
            updates = sync.restore_cpusets(records, {c.id: c for c in live},
                                           self._topology.online_cpus, placed_now=promoted)
            updates += self._cgroups_missed(req.containers, {u.container_id for u in updates})
        log.info("synchronized: %d containers managed, shared pool %s, %d updates",
                 len(records.containers), format_list(records.shared), len(updates))
        self._warn_degraded()
        return api.SynchronizeResponse(update=updates)

    def create_container(self, req: api.CreateContainerRequest) -> api.CreateContainerResponse:
        with self._metrics.admission():
            container = translate.container_of(req.pod, req.container)
            if claims := dra_cpu.cpu_claims(container.env):  # kubernetes-sigs/dra-driver-cpu's
                _, namespace, name = pod_identity(container.pod)
                dra_cpu.left_to_driver(f"{namespace}/{name}", container.name, claims)
                return api.CreateContainerResponse()
            spec = self._pod_spec(container)  # outside the lock: it may wait for the watch
            sandbox = whole_pod.sandbox_totals(req.pod)
            with self._lock, self._transaction():
                placement = self._admit(container, sandbox, spec)
                adjust = self._adjustment(placement, container)
                # The other shared containers' moves, already encoded: parsed in one call.
                updates = translate.shared_updates_wire(
                    self._records, api.CreateContainerResponse.UPDATE_FIELD_NUMBER,
                    skip=container.id)
                self._starts.created(container.id, Cpuset(placement.cpus, placement.mems))
                self._starts.cgroup_of(container.id, req.container.linux.cgroups_path)
        reply = api.CreateContainerResponse(adjust=adjust)
        reply.MergeFromString(updates)
        return reply

    def update_container(self, req: api.UpdateContainerRequest) -> api.UpdateContainerResponse:
        """An update of a running container's resources: an in-place resize when its CPU or
        memory request changes (nri_numa.nri.resize), else its cpuset stays."""
        with self._lock:
            record = self._records.containers.get(req.container.id)
            if record is None:
                return api.UpdateContainerResponse()
            updates: list[api.ContainerUpdate] = []
            if record.in_ledger and req.HasField("linux_resources"):
                with self._transaction():
                    resized, updates = resize.apply(self._records, record, self._resized(req))
                    if resized is not record:  # a smaller container may have freed room
                        updates = _last_per_container(updates + self._promote(
                            skip=record.id))
                    record = resized
            cpus = self._records.cpus_of(record)
        # The runtime merges this into the update it is applying: our cpuset stays.
        return api.UpdateContainerResponse(update=[translate.cpuset_update(
            record.id, cpus, record.mems, ignore_failure=False), *updates])

    def stop_container(self, req: api.StopContainerRequest) -> api.StopContainerResponse:
        with self._lock:
            updates = self._release([req.container.id])
        return api.StopContainerResponse(update=updates)

    def state_change(self, event: api.StateChangeEvent) -> None:
        if event.event == api.POST_START_CONTAINER:
            self._post_start(event.container)
            return
        with self._lock:
            if event.event == api.REMOVE_CONTAINER:
                ids = [event.container.id]
            elif event.event in (api.STOP_POD_SANDBOX, api.REMOVE_POD_SANDBOX):
                ids = self._records.in_sandbox(event.pod.id)
            else:
                return
            updates = self._release(ids)
        if updates:
            self._send_updates(updates)

    def shutdown(self) -> None:
        log.info("runtime asked nri-numa to shut down")

    def reconcile(self) -> list[api.ContainerUpdate]:
        """The drift repair's updates: degraded containers placed where room has appeared
        (nri_numa.nri.promotion), and the ledger's cpuset for every started container whose
        cgroup holds another one (nri_numa.nri.start_check); the caller sends them."""
        with self._lock:
            records = self._records
            updates = []
            if records.containers.unplaced_ids:
                try:
                    with self._transaction():
                        updates = self._promote()
                except PluginError as e:  # not saved: rolled back, tried again next time
                    log.warning("degraded containers not promoted: %s", e)
                    updates = []
            moved = {u.container_id for u in updates}
            wanted = {record.id: Cpuset(records.cpus_of(record), record.mems)
                      for record in records.containers.values() if record.id not in moved}
            for container_id in self._starts.drifted(wanted):
                record = records.containers[container_id]
                cpuset = wanted[container_id]
                self._metrics.repaired()
                decision_log.repaired(records.pods.get(record.sandbox_id), record, cpuset.cpus,
                                      "its cgroup differed at the periodic check")
                updates.append(translate.cpuset_update(record.id, cpuset.cpus, record.mems))
        return updates

    @property
    def reconcile_period(self) -> float:
        """Seconds between drift checks (cpuManagerReconcilePeriod); 0: none."""
        return self._records.ledger.ctx.config.cpu_manager_reconcile_period

    def _cgroups_missed(self, containers: Sequence[api.Container],
                        updated: set[str]) -> list[api.ContainerUpdate]:
        """Synchronize's updates for running containers whose cgroup missed an update that
        their spec got (nri_numa.nri.start_check)."""
        updates = []
        for container in containers:
            self._starts.cgroup_of(container.id, container.linux.cgroups_path)
            record = self._records.containers.get(container.id)
            if record is None or record.id in updated:
                continue
            cpus = self._records.cpus_of(record)
            if self._starts.cgroup_differs(container.linux.cgroups_path, Cpuset(cpus, record.mems)):
                self._metrics.repaired()
                decision_log.repaired(self._records.pods.get(record.sandbox_id), record, cpus,
                                      "its cgroup differed at Synchronize")
                updates.append(translate.cpuset_update(record.id, cpus, record.mems))
        return updates

    def _post_start(self, container: api.Container) -> None:
        """Send a started container its cpuset again when an update may have missed its
        cgroup (nri_numa.nri.start_check)."""
        with self._lock:
            record = self._records.containers.get(container.id)
            if record is None:
                self._starts.forget([container.id])
                return
            self._starts.cgroup_of(container.id, container.linux.cgroups_path)
            cpus = self._records.cpus_of(record)
            why = self._starts.missed(container.id, container.linux.cgroups_path,
                                      Cpuset(cpus, record.mems))
            if why is None:
                return
            self._metrics.repaired()
            decision_log.repaired(self._records.pods.get(record.sandbox_id), record, cpus, why)
        self._send_updates([translate.cpuset_update(record.id, cpus, record.mems)])

    # --- admission --------------------------------------------------------------------------

    def _pod_spec(self, container: RuntimeContainer) -> whole_pod.PodSpec | None:
        """The pod's spec from the API server, waiting a moment for a pod not seen before."""
        if self._pod_specs is None:
            return None
        first = container.pod.id not in self._records.pods
        return self._pod_specs.get(pod_identity(container.pod)[0],
                                   whole_pod.SPEC_WAIT_S if first else 0.0)

    def _admit(self, container: RuntimeContainer, sandbox: whole_pod.SandboxTotals | None = None,
               spec: whole_pod.PodSpec | None = None) -> Placement:
        """Place ``container``; PluginError with the engine's reason when it does not fit.
        ``sandbox`` and ``spec``: what the sandbox and the API server tell of the whole pod."""
        records = self._records
        asked = self._reader.admission(container, records, sandbox, spec)
        pod, request, pod_req = asked.pod, asked.request, asked.pod_request
        try:
            result = records.ledger.admit(pod_req, [request.name])
        except (RequestError, ValueError) as e:
            self._refused(pod, request.name, container.id, None, "RequestError", None, str(e))
            raise PluginError(f"nri-numa: {decision_log.describe(pod, request.name)}: "
                              f"{e}") from None
        self._metrics.decided(records.ledger.ctx, pod_req, request, result.decision, result.steps)
        if (chosen := result.decision.preferred_numa) is not None and not chosen.honoured:
            decision_log.stale_choice(pod, request.name, chosen)
        rejection = result.decision.rejection
        if rejection is not None:
            # One line, led by the kubelet's reason, as the kubelet would show it.
            text = rejection.message
            if not text.startswith(rejection.reason):
                text = f"{rejection.reason}: {text}"
            self._refused(pod, request.name, container.id, rejection.policy, rejection.reason,
                          rejection.resource, text)
            raise PluginError(f"nri-numa: {text}")
        placement = result.decision.placements[0]
        records.remember(container.id, pod, request, placement)
        decision_log.placed(pod, result.decision.policy, placement, container.id,
                            pod_known_from=(asked.known_from if result.decision.scope == "pod"
                                            else None))
        return placement

    def _resized(self, req: api.UpdateContainerRequest) -> RuntimeContainer:
        """The container as it will be: its new resources in place of the old."""
        container = api.Container()
        container.CopyFrom(req.container)
        container.linux.resources.CopyFrom(req.linux_resources)
        return translate.container_of(req.pod, container)

    def _adjustment(self, placement: Placement,
                    container: RuntimeContainer) -> api.ContainerAdjustment:
        """The container's adjustment; PluginError (undoing the placement) when a device it
        was given cannot be handed over."""
        try:
            grant = self._granter.grant(placement.devices)
        except GrantError as e:
            pod = self._records.pods[container.pod.id]
            self._refused(pod, placement.container, container.id, None, "DeviceError", None,
                          str(e))
            raise PluginError(f"nri-numa: container {placement.container}: {e}") from None
        if grant.cdi_devices:
            log.info("container %s: devices by CDI name: %s", placement.container,
                     ", ".join(grant.cdi_devices))
        return translate.adjustment(placement, grant)

    def _refused(self, pod: PodRecord, container: str, container_id: str, policy: str | None,
                 reason: str, resource: str | None, text: str) -> None:
        decision_log.refused(pod, container, container_id, policy, reason, resource, text)
        self._on_refusal(pod, container, reason, text)

    # --- release ----------------------------------------------------------------------------

    def _release(self, ids: Sequence[str]) -> list[api.ContainerUpdate]:
        """Release containers; a failed write keeps the release: the file then holds more
        than is in use, which is safe."""
        self._starts.forget(list(ids))
        released = self._records.release(ids)
        if not released:
            return []
        for record in released:
            log.info("released container %s (%s) of pod %s", record.name, record.id,
                     record.pod_uid)
        # What was freed may hold a degraded container (saved with the release).
        updates = self._promote()
        try:
            self._state_file.save(self._records)
        except CheckpointError as e:
            log.error("state not saved after a release (kept in memory): %s", e)
        self._count_degraded()
        self._on_change()
        return updates

    # --- degraded containers (nri_numa.nri.promotion) ---------------------------------------

    def _promote(self, skip: str | None = None) -> list[api.ContainerUpdate]:
        """Place the degraded containers that fit now; the updates that move them onto their
        CPUs and memory nodes, then the shared containers' (but ``skip``'s) when the pool
        moved. The caller holds the lock and saves."""
        records = self._records
        if not records.containers.unplaced_ids:
            return translate.shared_updates(records, skip=skip)
        moves = [translate.cpuset_update(p.record.id, p.placement.cpus, p.placement.mems)
                 for p in promotion.promote(records)]
        for update in moves:
            self._warned.discard(update.container_id)
        return moves + translate.shared_updates(records, skip=skip)

    def _count_degraded(self) -> None:
        """The gauge's count, after a change; the caller holds the lock."""
        records = self._records
        self._degraded_count = (len(promotion.degraded(records))
                                if records.containers.unplaced_ids else 0)

    def _warn_degraded(self) -> None:
        """One warning line, and one call of ``on_degraded`` (the pod's Event), for each
        container newly found degraded: told once per agent process while it stays so."""
        with self._lock:
            records = self._records
            found = promotion.degraded(records)
            self._warned &= {record.id for record in found}
            for record in found:
                if record.id in self._warned:
                    continue
                self._warned.add(record.id)
                pod = records.pods[record.sandbox_id]
                text = (f"container {record.name} runs in the shared pool without the "
                        "exclusive CPUs its QoS class gets: it was running before nri-numa "
                        "could place it, and there was no room; it is moved onto them as soon "
                        "as room appears")
                log.warning("degraded %s: %s", decision_log.describe(pod, record.name), text)
                self._on_degraded(pod, record.name, text)

    # --- configuration and persistence ------------------------------------------------------

    def reload(self, config: EngineConfig, where: str) -> None:
        """A configuration re-read while the agent runs (SIGHUP, --watch-config): applied as a
        runtime's Configure is, refused (PluginError, ledger untouched) where it would change
        what placed containers hold."""
        with self._lock:
            self._reconfigure(config, where)

    def _reconfigure(self, config: EngineConfig, source: str = "the runtime") -> None:
        records = self._records
        if config == records.ledger.ctx.config:
            return
        try:
            ctx = EngineContext.build(self._topology, config)
        except ConfigError as e:
            raise PluginError(f"nri-numa: configuration does not fit this machine: {e}") from None
        # As at start-up: placements made under other policies are not carried over.
        live = len(records.containers)
        changes = recorded(records.ledger.ctx).changes_to(recorded(ctx))
        where = self._state_file.where
        if live and changes:
            raise PluginError(f"nri-numa: {refuse_change(where, changes, live)}")
        try:
            records.ledger = Ledger.restore(ctx, records.ledger.to_dict())
        except LedgerError as e:
            if live:
                raise PluginError(f"nri-numa: {refuse_change(where, [str(e)], live)}") from None
            records.ledger = Ledger(ctx)
            records.pods.clear()
        self._state_file.configured(ctx)
        self._on_change()
        log.info("configuration from %s: topology policy %s, CPU manager %s", source,
                 config.topology_manager_policy, config.cpu_manager_policy)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._state_file.transaction(self._records):
            yield
        self._count_degraded()
        self._on_change()


def _last_per_container(updates: list[api.ContainerUpdate]) -> list[api.ContainerUpdate]:
    """One update per container, the last one made for it, in the order first made."""
    last: dict[str, api.ContainerUpdate] = {}
    for update in updates:
        last[update.container_id] = update
    return list(last.values())


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
