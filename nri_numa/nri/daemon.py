"""``nri-numa run``: the plugin as a long-running agent.

External mode (the recommended one, docs/nri-protocol.md §7) connects to the runtime's NRI socket
and connects again whenever the socket is missing or stale or the runtime restarts, waiting a
little longer each time (doubling, capped, with jitter so that many nodes do not retry in step).
Every new connection registers again and gets a full Synchronize; a connection the runtime took
in (its Synchronize answered) starts the waits over. Pre-launched mode, when the
runtime started us with ``NRI_PLUGIN_SOCKET``, serves that one inherited socket until it closes.

Updates that cannot travel in a reply are sent by one sender thread after the handler that made
them has returned. SIGTERM and SIGINT close the session and end the process cleanly; their
handlers are in place before any file is opened (nri_numa.agent.signals), so a stop during
start-up ends it at once too.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nri_numa.agent.inputs import InputFileError, read_config_document, read_topology_file
from nri_numa.agent.metrics import (NO_METRICS, MetricsError, MetricsServer, NoMetrics,
                                    PluginMetrics)
from nri_numa.agent.signals import StopSignals, Stopped
from nri_numa.agent.settings import (DEFAULT_CDI_SPEC_DIRS, DEFAULT_DEV_ROOT,
                                     DEFAULT_DEVICE_INJECTION, DEFAULT_INDEX, DEFAULT_NAME,
                                     DEFAULT_SOCKET, DEFAULT_STATE_DIR, AgentSettings,
                                     MetricsAddress)
from nri_numa.cluster.refusals import degraded_message, refusal_message
from nri_numa.engine.config import ConfigError, EngineConfig
from nri_numa.nri.config_reload import ConfigReloader, LiveTargets, Reread
from nri_numa.nri.drift_repair import DriftRepair
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.nri.session import NriSession, SessionClosed
from nri_numa.nri.wire.ttrpc_message import TtrpcError
from nri_numa.nri.whole_pod import PodSpecs
from nri_numa.podresources import DEFAULT_SOCKET as DEFAULT_POD_RESOURCES_SOCKET
from nri_numa.podresources.source import hint_source
from nri_numa.runtime import DeviceGranter, DeviceLocator
from nri_numa.runtime.cdi import CdiRegistry
from nri_numa.state.checkpoint import CheckpointError, CheckpointStore, machine_fingerprint
from nri_numa.state.plugin_records import PodRecord
from nri_numa.topology.model import Topology

if TYPE_CHECKING:
    from nri_numa.cluster.feed import ClusterFeed
    from nri_numa.cluster.start import ExportPlan
    from nri_numa.state.kubelet_checkpoints import KubeletPlacements

log = logging.getLogger(__name__)

PRELAUNCH_SOCKET_ENV = "NRI_PLUGIN_SOCKET"
PRELAUNCH_NAME_ENV = "NRI_PLUGIN_NAME"
PRELAUNCH_INDEX_ENV = "NRI_PLUGIN_IDX"
BACKOFF_FIRST = 0.5  # seconds
BACKOFF_CAP = 30.0
# Where started containers' cpusets are read back (nri_numa.nri.start_check); the DaemonSet
# mounts the host's /sys.
CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBELET_ROOT = Path("/var/lib/kubelet")


class DaemonError(Exception):
    """The agent cannot start; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class DaemonOptions:
    socket_path: str = DEFAULT_SOCKET
    config_file: Path | None = None
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    topology_file: Path | None = None
    name: str = DEFAULT_NAME
    index: str = DEFAULT_INDEX
    pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET  # "": no kubelet hints
    dev_root: Path = Path(DEFAULT_DEV_ROOT)  # the host's device nodes, for devices given
    device_injection: str = DEFAULT_DEVICE_INJECTION  # GPUs as nodes, CDI names, or auto
    cdi_spec_dirs: tuple[Path, ...] = tuple(Path(d) for d in DEFAULT_CDI_SPEC_DIRS)
    # None: no metrics server. `nri-numa run` serves them by default (agent.settings).
    metrics_address: MetricsAddress | None = None
    # True when nobody asked for that address: a port in use then only costs the metrics.
    metrics_optional: bool = False
    # The NodeResourceTopology export (nri_numa.cluster): auto, on or off.
    nrt_export: str = "off"
    kubeconfig: Path | None = None
    node_name: str = ""
    nrt_resync_period: float = 60.0
    evict_refused_pods: bool = True
    evict_after_refusals: int = 3
    eviction_delay: float = 30.0
    kubelet_state_dir: Path | None = None  # None: /var/lib/kubelet
    # Reading the config file again (SIGHUP; --watch-config polls it): the settings in use and
    # how to read them afresh. None: SIGHUP is logged and changes nothing.
    settings: AgentSettings | None = None
    reread: Callable[[], Reread] | None = None
    watch_config: bool = False

    @classmethod
    def from_settings(cls, settings: AgentSettings, config_file: Path | None) -> DaemonOptions:
        return cls(socket_path=settings.nri_socket, config_file=config_file,
                   state_dir=settings.state_dir, topology_file=settings.topology_file,
                   name=settings.plugin_name, index=settings.plugin_index,
                   pod_resources_socket=settings.pod_resources_socket,
                   dev_root=settings.dev_root, device_injection=settings.device_injection,
                   cdi_spec_dirs=settings.cdi_spec_dirs,
                   metrics_address=settings.metrics_address,
                   metrics_optional="metrics_address" not in settings.given,
                   nrt_export=settings.nrt_export, kubeconfig=settings.kubeconfig,
                   node_name=settings.node_name,
                   nrt_resync_period=settings.nrt_resync_period,
                   evict_refused_pods=settings.evict_refused_pods,
                   evict_after_refusals=settings.evict_after_refusals,
                   eviction_delay=settings.eviction_delay,
                   kubelet_state_dir=settings.kubelet_state_dir, settings=settings)


def backoff_delays(first: float = BACKOFF_FIRST, cap: float = BACKOFF_CAP,
                   rng: Callable[[], float] = random.random) -> Iterator[float]:
    """first, 2×first, 4×first … up to cap, each scaled by a random factor in [0.5, 1)."""
    delay = first
    while True:
        yield delay * (0.5 + rng() / 2)
        delay = min(cap, delay * 2)


class UpdateSender:
    """Sends updates made outside a reply, on its own thread, through the current session."""

    def __init__(self) -> None:
        self._queue: queue.Queue[list[api.ContainerUpdate] | None] = queue.Queue()
        self._session: NriSession | None = None
        self._thread = threading.Thread(target=self._serve, name="nri-updates", daemon=True)
        self._thread.start()

    def use(self, session: NriSession | None) -> None:
        self._session = session

    def connected(self) -> bool:
        """Whether a runtime is connected and has synchronized with us."""
        session = self._session
        return session is not None and session.synchronized

    def submit(self, updates: list[api.ContainerUpdate]) -> None:
        self._queue.put(list(updates))

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        while (updates := self._queue.get()) is not None:
            session = self._session
            if session is None:
                log.warning("%d container updates dropped: no runtime connected (the next "
                            "Synchronize restores every cpuset)", len(updates))
                continue
            try:
                failed = session.update_containers(updates)
            except (SessionClosed, TtrpcError, RuntimeError) as e:
                log.warning("%d container updates not sent: %s", len(updates), e)
                continue
            except Exception:  # the sender must outlive any one batch
                log.exception("%d container updates not sent", len(updates))
                continue
            for update in failed:
                log.warning("runtime could not update container %s", update.container_id)


class Daemon:
    def __init__(self, plugin: NumaPlugin, sender: UpdateSender, options: DaemonOptions, *,
                 connect: Callable[[str], NriSession] = NriSession.connect,
                 delays: Iterator[float] | None = None) -> None:
        self._plugin = plugin
        self._sender = sender
        self._options = options
        self._connect = connect
        self._delays = delays
        self._stopping = threading.Event()
        self._session: NriSession | None = None
        self._session_lock = threading.Lock()
        self.error: DaemonError | None = None  # why serving ended, when it could not go on

    def stop(self) -> None:
        """From any thread or a signal handler: close the session, end ``run_*``."""
        self._stopping.set()
        with self._session_lock:
            session = self._session
        if session is not None:
            session.close()

    def run_external(self) -> None:
        """Connect, serve, and connect again until stopped."""
        delays = self._delays or backoff_delays()
        attempt = 0
        while not self._stopping.is_set():
            attempt += 1
            log.info("connecting to %s (attempt %d)", self._options.socket_path, attempt)
            try:
                session = self._connect(self._options.socket_path)
            except ConnectionError as e:
                log.warning("%s", e)
            else:
                self._serve(session, self._options.name, self._options.index)
                if session.synchronized:
                    # The runtime took us in, so this is a new outage (a restart): start the
                    # sequence over, or a second restart soon after the first would wait longer.
                    delays, attempt = self._delays or backoff_delays(), 0
            if self._stopping.is_set():
                break
            delay = next(delays)
            log.info("reconnecting in %.1f s", delay)
            self._stopping.wait(delay)

    def run_prelaunched(self, fd: int, name: str, index: str) -> None:
        """Serve the socket the runtime handed us, once: it never reconnects a launched plugin."""
        try:
            session = NriSession.from_fd(fd)
        except ValueError as e:
            raise DaemonError(f"{PRELAUNCH_SOCKET_ENV}={fd}: {e}") from None
        self._serve(session, name, index)

    def _serve(self, session: NriSession, name: str, index: str) -> None:
        with self._session_lock:
            self._session = session
        if self._stopping.is_set():
            session.close()
        self._sender.use(session)
        try:
            session.run(self._plugin, name, index)
            log.info("NRI session closed")
        except SessionClosed as e:
            log.warning("NRI session ended: %s", e.reason)
        except ValueError as e:
            raise DaemonError(str(e)) from None
        finally:
            self._sender.use(None)
            with self._session_lock:
                self._session = None


# --- start-up --------------------------------------------------------------------------------


def load_topology(path: Path | None) -> Topology:
    """The machine from a topology JSON file, else discovered from this host."""
    if path is None:
        from nri_numa.topology import discover

        topology = discover("/")
        for warning in topology.warnings:
            log.warning("discovery: %s", warning)
        return topology
    try:
        return read_topology_file(path)
    except InputFileError as e:
        raise DaemonError(str(e)) from None


def load_config(path: Path | None) -> EngineConfig:
    """KubeletConfiguration keys from a YAML or JSON file; defaults without one."""
    if path is None:
        return EngineConfig()
    try:
        document = read_config_document(path)
    except InputFileError as e:
        raise DaemonError(str(e)) from None
    log_ignored_keys(path, document.ignored_kubelet_keys)
    return document.engine


def log_ignored_keys(path: Path, keys: tuple[str, ...]) -> None:
    """One line for the kubelet's keys nri-numa leaves to the kubelet (a kubelet's own file)."""
    if keys:
        log.info("%s: %d KubeletConfiguration keys ignored (the kubelet's, not used by "
                 "nri-numa): %s", path, len(keys), ", ".join(keys))


def plugin_store(state_dir: Path, topology: Topology) -> CheckpointStore:
    """The plugin's checkpoint, without fsync: it must survive the agent, not the machine
    (nri_numa.state.checkpoint), and an fsync before every answer doubled its cost on disk."""
    return CheckpointStore(state_dir, machine_fingerprint(topology), fsync=False)


def run(options: DaemonOptions, environ: dict[str, str] | None = None,
        signals: StopSignals | None = None) -> None:
    """Start the agent and serve until SIGTERM/SIGINT (or, pre-launched, until the runtime
    closes the socket). Raises DaemonError when it cannot start. ``signals``: handlers the
    caller installed before anything else (cmd_run does); by default they are installed here,
    before any file is opened, and removed on return. A signal during start-up ends it
    cleanly: the lock released, nothing served."""
    own = signals is None
    signals = signals or StopSignals()
    try:
        _run(options, dict(os.environ if environ is None else environ), signals)
    except Stopped as e:
        log.info("stopped by %s during start-up", e)
    finally:
        if own:
            signals.restore()


def _run(options: DaemonOptions, environ: dict[str, str], signals: StopSignals) -> None:
    topology = load_topology(options.topology_file)
    config = load_config(options.config_file)
    store = plugin_store(options.state_dir, topology)
    try:
        store.lock()
    except CheckpointError as e:
        raise DaemonError(str(e)) from None
    sender: UpdateSender | None = None
    server: MetricsServer | None = None
    feed: ClusterFeed | None = None
    drift: DriftRepair | None = None
    reloader: ConfigReloader | None = None
    plan = _export_plan(options, environ)

    def refused(pod: PodRecord, container: str, reason: str, text: str) -> None:
        """A refusal for the export process (its Event and eviction), once it runs."""
        if feed is not None and plan is not None:
            feed.send(refusal_message(pod.namespace, pod.name, pod.uid, container, reason, text,
                                      plan.node_name))

    def degraded(pod: PodRecord, container: str, text: str) -> None:
        """A container run without its exclusive CPUs, for the export process (its Event)."""
        if feed is not None and plan is not None:
            feed.send(degraded_message(pod.namespace, pod.name, pod.uid, container, text,
                                       plan.node_name))

    try:  # from here on a stop (Stopped included) releases the lock
        sender = UpdateSender()
        # The scrape reads the plugin made just below; the server starts only once it exists.
        metrics = (PluginMetrics(lambda: (plugin.ledger, plugin.containers),
                                 degraded=lambda: plugin.degraded_count)
                   if options.metrics_address is not None else NO_METRICS)
        cdi = CdiRegistry(options.cdi_spec_dirs)  # CDI names: hints, and GPUs given by name
        # With a Kubernetes client, the node's pods from the API server (nri_numa.nri.whole_pod).
        pod_specs = PodSpecs() if plan is not None else None
        locator = DeviceLocator(topology, cdi=cdi)
        try:
            plugin = NumaPlugin(topology, config, store, send_updates=sender.submit,
                                metrics=metrics,
                                kubelet_hints=hint_source(options.pod_resources_socket, topology,
                                                          locator.cdi_numa_nodes),
                                locator=locator,
                                granter=DeviceGranter(topology, options.dev_root, cdi=cdi,
                                                      injection=options.device_injection),
                                cgroup_root=CGROUP_ROOT,
                                on_change=lambda: feed.changed() if feed is not None else None,
                                on_refusal=refused if plan is not None else None,
                                on_degraded=degraded if plan is not None else None,
                                kubelet_state=_kubelet_state(options.kubelet_state_dir),
                                pod_specs=pod_specs)
        except (ConfigError, CheckpointError) as e:
            raise DaemonError(str(e)) from None
        # What start-up built (modules, the machine, the restored state) lives as long as the
        # agent: out of the cyclic collector's full passes, which otherwise walk it all while a
        # runtime waits; each compaction freezes the state again
        # (nri_numa.nri.persistence). Objects freed later are still freed by their refcount.
        gc.freeze()
        if plan is not None:
            feed = _start_export(plan, plugin, metrics, pod_specs)
        drift = DriftRepair(plugin.reconcile, sender.submit, sender.connected,
                            lambda: plugin.reconcile_period)
        drift.start()
        if isinstance(metrics, PluginMetrics) and options.metrics_address is not None:
            server = _serve_metrics(metrics, options.metrics_address, options.metrics_optional)

        def move_metrics(address: MetricsAddress | None) -> None:
            nonlocal server
            if address is not None and not isinstance(metrics, PluginMetrics):
                raise DaemonError("metrics were off at start; a restart turns them on")
            if server is not None:
                server.stop()
                server = None
            if address is not None and isinstance(metrics, PluginMetrics):
                server = _serve_metrics(metrics, address, optional=False)

        reloader = _start_reloader(options, plugin, signals, move_metrics)
        _serve_until_signalled(Daemon(plugin, sender, options), options, environ, signals)
    finally:
        if reloader is not None:
            reloader.stop()
        if drift is not None:
            drift.stop()
        if server is not None:
            server.stop()
        if feed is not None:
            feed.stop()
        if sender is not None:
            sender.stop()
        store.unlock()
    log.info("nri-numa stopped")


def _start_reloader(options: DaemonOptions, plugin: NumaPlugin, signals: StopSignals,
                    move_metrics: Callable[[MetricsAddress | None], None]
                    ) -> ConfigReloader | None:
    """The thread that reads the config file again on SIGHUP (or when it changes)."""
    if options.config_file is None or options.reread is None or options.settings is None:
        return None
    from nri_numa.agent.logs import configure

    reloader = ConfigReloader(options.config_file, options.reread, options.settings,
                              LiveTargets(plugin.reload, configure, move_metrics),
                              signals.reload_requested, watch=options.watch_config)
    reloader.start()
    if options.watch_config:
        log.info("watching %s: a change is read like a SIGHUP", options.config_file)
    return reloader


def _kubelet_state(folder: Path | None) -> KubeletPlacements | None:
    """The kubelet's CPU and Memory Manager checkpoints, to adopt their placements at the first
    Synchronize (docs/migrating-from-kubelet.md); None without either. A bad file is one
    warning: what it would have given is then placed anew, as without it."""
    from nri_numa.state.kubelet_checkpoints import (CPU_STATE_FILE, MEMORY_STATE_FILE,
                                                    KubeletCheckpointError, KubeletPlacements,
                                                    read_cpu_state, read_memory_state)

    found = {}
    for name, read in ((CPU_STATE_FILE, read_cpu_state), (MEMORY_STATE_FILE, read_memory_state)):
        path = (folder or KUBELET_ROOT) / name
        if not path.is_file():
            continue
        try:
            found[name] = read(path)
        except KubeletCheckpointError as e:
            log.warning("%s; what it gives is placed anew", e)
    if not found:
        if folder is not None:
            log.warning("%s: neither %s nor %s; running containers are placed anew", folder,
                        CPU_STATE_FILE, MEMORY_STATE_FILE)
        return None
    state = KubeletPlacements(found.get(CPU_STATE_FILE), found.get(MEMORY_STATE_FILE))
    for name, held in ((CPU_STATE_FILE, state.cpu), (MEMORY_STATE_FILE, state.memory)):
        if held is not None:
            log.info("the kubelet's checkpoint %s (policy %s, %d containers placed): adopted at "
                     "the first Synchronize where it fits", (folder or KUBELET_ROOT) / name,
                     held.policy, len(held.assignments))
    return state


def _export_plan(options: DaemonOptions, environ: dict[str, str]) -> ExportPlan | None:
    from nri_numa.cluster.start import ExportSetupError, export_plan

    try:
        return export_plan(options.nrt_export, options.kubeconfig, options.node_name,
                           options.nrt_resync_period, environ,
                           evict=(options.evict_refused_pods, options.evict_after_refusals,
                                  options.eviction_delay))
    except ExportSetupError as e:
        raise DaemonError(str(e)) from None


def _start_export(plan: ExportPlan, plugin: NumaPlugin, metrics: PluginMetrics | NoMetrics,
                  pod_specs: PodSpecs | None = None) -> ClusterFeed:
    """The export process, fed from the plugin's committed ledger (nri_numa.cluster.feed);
    with ``pod_specs``, it watches the node's pods and fills them (nri_numa.nri.whole_pod)."""
    from nri_numa.cluster.feed import ClusterFeed, ExportCollector, export_command
    from nri_numa.cluster.start import nrt_snapshot

    feed = ClusterFeed(nrt_snapshot(plugin.committed, plan.node_name),
                       export_command(plan.kubeconfig, plan.resync_s, plan.evict,
                                      plan.evict_after, plan.eviction_delay_s,
                                      plan.node_name if pod_specs is not None else ""),
                       on_pods=pod_specs.handle if pod_specs is not None else None)
    if isinstance(metrics, PluginMetrics):
        metrics.registry.register(ExportCollector(feed))
    feed.start()
    log.info("exporting NodeResourceTopology %s (%s)", plan.node_name,
             plan.kubeconfig or "the pod's service account")
    return feed


def _serve_metrics(metrics: PluginMetrics, address: MetricsAddress,
                   optional: bool) -> MetricsServer | None:
    try:
        server = MetricsServer(metrics, address)
    except MetricsError as e:
        if not optional:
            raise DaemonError(str(e)) from None
        log.warning("%s; running without metrics (set metricsAddress or --metrics-address to "
                    "choose another address, \"off\" to say none)", e)
        return None
    log.info("metrics served on %s", server.url)
    return server


def _serve_until_signalled(daemon: Daemon, options: DaemonOptions, environ: dict[str, str],
                           signals: StopSignals) -> None:
    worker = threading.Thread(target=_serve_until_done, name="nri-session",
                              args=(daemon, options, environ), daemon=True)
    signals.serving(daemon.stop)  # no longer raises: the session thread is about to start
    try:
        worker.start()
        while worker.is_alive():
            worker.join(timeout=0.5)  # short waits, so signal handlers run promptly
    finally:
        daemon.stop()
    if daemon.error is not None:
        raise daemon.error


def _serve_until_done(daemon: Daemon, options: DaemonOptions, environ: dict[str, str]) -> None:
    try:
        fd = environ.get(PRELAUNCH_SOCKET_ENV)
        if fd is None:
            daemon.run_external()
            return
        if not fd.isdigit():
            raise DaemonError(f"{PRELAUNCH_SOCKET_ENV}={fd!r} is not a file descriptor number")
        # The runtime registers a launched plugin under the name it chose, whatever we send.
        name = environ.get(PRELAUNCH_NAME_ENV) or options.name
        index = environ.get(PRELAUNCH_INDEX_ENV) or options.index
        log.info("pre-launched by the runtime as %s-%s (no Synchronize will come)", index, name)
        daemon.run_prelaunched(int(fd), name, index)
    except DaemonError as e:
        daemon.error = e
