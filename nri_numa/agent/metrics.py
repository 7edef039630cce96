"""Prometheus metrics of the NRI plugin, served over HTTP on a thread of their own.

Counters and the histogram carry the kubelet's names (pkg/kubelet/metrics) under the
``nri_numa_`` prefix instead of ``kubelet_``, and move when the kubelet's would, as far as NRI
lets the plugin see it: the kubelet admits a pod, the plugin admits one container per
CreateContainer, so one CreateContainer is one admission request.

* ``topology_manager_admission_requests_total``: every CreateContainer;
  ``topology_manager_admission_errors_total``: every one refused (a TopologyAffinityError, a
  provider that could not allocate, or a container that cannot be read or saved);
  ``topology_manager_admission_duration_ms``: how long it took, with the kubelet's buckets.
* ``cpu_manager_pinning_requests_total``: the static CPU policy gave (or tried to give) a
  container exclusive CPUs — a Guaranteed container asking for whole CPUs, once the topology
  merge let it through; ``cpu_manager_pinning_errors_total``: that allocation failed.
* ``memory_manager_pinning_requests_total`` / ``..._errors_total``: the same for the Static memory
  policy, which pins every container of a Guaranteed pod. The providers allocate CPUs, then
  memory, then devices: a container whose CPUs could not be had never reaches memory.
* ``container_aligned_compute_resources_count`` / ``..._failure_count`` (counters named
  without ``_total``, as the kubelet names them), labels ``boundary`` and ``scope``: the
  topology manager's ``numa_node`` alignment under the single-numa-node policy, per container
  (container scope) or once per pod at its merge (pod scope); the static CPU policy's
  ``physical_cpu`` alignment under full-pcpus-only; ``uncore_cache``: an exclusive allocation
  whose CPUs share one uncore cache (no failure series, as in the kubelet).
* ``scheduled_numa_nodes_stale_total`` (ours, no kubelet twin): containers whose pod carried
  the scheduler extender's NUMA nodes (numa.nri.io/scheduled-numa-nodes) that no longer held
  them, so the engine decided anew.

Gauges are computed from the ledger when scraped (``LedgerCollector``), so they are never out of
step with it. The CPU manager's are among them (``cpu_manager_shared_pool_size_millicores``,
``cpu_manager_exclusive_cpu_allocation_count``, ``cpu_manager_allocation_per_numa``), every
NUMA node with CPUs shown (the kubelet sets only the nodes holding exclusive CPUs). The
handlers only increment counters, which takes a lock for a few instructions.
``degraded_containers`` (ours) is the plugin's count as of its last committed change
(nri_numa.nri.promotion): Guaranteed containers running in the shared pool without the CPUs
(or memory nodes) the kubelet would pin them to.
A scrape reads an immutable allocations value and never takes the plugin's lock.
The text format and the HTTP server are the agent's own (prometheus_text, metrics_http): the
client library's imports cost more memory than the rest of the agent's metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nri_numa.agent.prometheus_text import (CONTENT_TYPE, Counter, Histogram, LabelledCounter,
                                            MetricFamily, Registry, exposition, gauge_family)

if TYPE_CHECKING:
    from nri_numa.agent.settings import MetricsAddress
    from nri_numa.engine.allocations import Allocations
    from nri_numa.engine.context import EngineContext
    from nri_numa.engine.decision import Decision
    from nri_numa.engine.memory.state import MemoryState
    from nri_numa.engine.request import ContainerRequest, PodRequest
    from nri_numa.engine.scope import MergeStep
    from nri_numa.state.ledger import LedgerReader
    from nri_numa.state.plugin_records import ContainerRecord

log = logging.getLogger(__name__)

PREFIX = "nri_numa"
# The kubelet's: metrics.ExponentialBuckets(.05, 2, 15), in milliseconds (0.05 ms to 819.2 ms).
ADMISSION_BUCKETS_MS = tuple(0.05 * 2 ** i for i in range(15))
# The kubelet's alignment series (pkg/kubelet/metrics: AlignedNUMANode, AlignedPhysicalCPU,
# AlignedUncoreCache; AlignScopeContainer, AlignScopePod), as (boundary, scope). Its topology
# manager and static CPU policy add each with 0 at start; the uncore cache has no failure series.
NUMA_NODE, PHYSICAL_CPU, UNCORE_CACHE = "numa_node", "physical_cpu", "uncore_cache"
ALIGNED_SERIES = ((NUMA_NODE, "container"), (NUMA_NODE, "pod"), (PHYSICAL_CPU, "container"),
                  (UNCORE_CACHE, "container"))
ALIGNMENT_FAILURE_SERIES = ALIGNED_SERIES[:3]


class MetricsError(Exception):
    """The metrics server cannot start; the message names the address."""


class NoMetrics:
    """What the plugin uses without a metrics server: every call does nothing."""

    @contextmanager
    def admission(self) -> Iterator[None]:
        yield

    def decided(self, ctx: EngineContext, pod: PodRequest, request: ContainerRequest,
                decision: Decision, steps: Sequence[MergeStep] = ()) -> None:
        pass

    def repaired(self) -> None:
        pass


NO_METRICS = NoMetrics()


@dataclass(frozen=True, slots=True)
class Pinning:
    """What one decision did to the CPU and memory managers' counters."""

    cpu_request: bool = False
    cpu_error: bool = False
    memory_request: bool = False
    memory_error: bool = False


def pinning_of(ctx: EngineContext, pod: PodRequest, request: ContainerRequest,
               decision: Decision) -> Pinning:
    """The kubelet's rules (cpumanager policy_static.Allocate, memorymanager policy_static
    .Allocate) applied to one engine decision."""
    from nri_numa.engine.request import QosClass, guaranteed_cpus

    rejection = decision.rejection
    # The providers allocate only once the merge admitted the container: a TopologyAffinityError
    # (or an annotation refused) never reached them; any other refusal is the provider's own.
    reached = rejection is None or (rejection.resource is not None
                                    and rejection.reason != "TopologyAffinityError")
    failed = rejection.resource if rejection is not None and reached else None
    # The kubelet's allocation order is devices, CPUs, memory (the order its hint providers are
    # added in): a device that cannot be had stops the container before the CPU manager.
    if failed is not None and failed not in ("cpu", "memory") and not failed.startswith(
            "hugepages-"):
        reached, failed = False, None
    cpu_failed = failed == "cpu"
    wants_cpus = ctx.cpu_static and guaranteed_cpus(pod, request) > 0
    wants_memory = ctx.memory_static and pod.qos is QosClass.GUARANTEED
    memory_failed = failed is not None and (failed == "memory" or failed.startswith("hugepages-"))
    return Pinning(cpu_request=reached and wants_cpus, cpu_error=wants_cpus and cpu_failed,
                   memory_request=reached and wants_memory and not cpu_failed,
                   memory_error=wants_memory and memory_failed)


@dataclass(frozen=True)
class Alignment:
    """What one decision did to the alignment counters: (boundary, scope) series."""

    aligned: tuple[tuple[str, str], ...] = ()
    failed: tuple[tuple[str, str], ...] = ()


def alignment_of(ctx: EngineContext, decision: Decision, pinning: Pinning,
                 steps: Sequence[MergeStep] = ()) -> Alignment:
    """The kubelet's rules (topologymanager scope_container/scope_pod Admit, cpumanager
    policy_static Allocate and updateMetricsOnAllocate) applied to one engine decision.
    ``steps``: the admission's merges; a merge of subject "pod" is the pod scope's one merge."""
    aligned: list[tuple[str, str]] = []
    failed: list[tuple[str, str]] = []
    rejection = decision.rejection
    if decision.policy == "single-numa-node":  # IsAlignmentGuaranteed
        scope = "pod" if decision.scope == "pod" else "container"
        if rejection is not None and rejection.reason == "TopologyAffinityError":
            failed.append((NUMA_NODE, scope))
        elif rejection is None and (scope == "container" or any(
                step.subject == "pod" and step.admitted for step in steps)):
            aligned.append((NUMA_NODE, scope))
    if pinning.cpu_request and ctx.config.cpu_options.full_pcpus_only:
        (failed if pinning.cpu_error else aligned).append((PHYSICAL_CPU, "container"))
    if pinning.cpu_request and rejection is None and decision.placements:
        placement = decision.placements[0]
        mask = 0
        for cpu in placement.cpus:
            mask |= 1 << cpu
        # isAlignedAtUncoreCache: every CPU in the same uncore cache as the first.
        caches = ctx.cpus.uncore_cpus.values()
        if placement.exclusive and any(not mask & ~cache for cache in caches):
            aligned.append((UNCORE_CACHE, "container"))
    return Alignment(tuple(aligned), tuple(failed))


class PluginMetrics:
    """The counters the handlers move, and the registry a scrape reads."""

    def __init__(self, view: Callable[[], tuple[LedgerReader, Mapping[str, ContainerRecord]]],
                 degraded: Callable[[], int] | None = None) -> None:
        """``view``: the ledger and the records as last committed; ``degraded``: the count of
        degraded containers (none: the gauge is left out)."""
        self.registry = Registry()
        r = self.registry
        self.admission_requests = r.register(Counter(
            f"{PREFIX}_topology_manager_admission_requests", "The number of admission requests "
            "where resources have to be aligned (one per CreateContainer)."))
        self.admission_errors = r.register(Counter(
            f"{PREFIX}_topology_manager_admission_errors", "The number of admission request "
            "failures where resources could not be aligned."))
        self.admission_duration = r.register(Histogram(
            f"{PREFIX}_topology_manager_admission_duration_ms", "Duration in milliseconds to "
            "serve an admission request (one CreateContainer).", buckets=ADMISSION_BUCKETS_MS))
        self.cpu_requests = r.register(Counter(
            f"{PREFIX}_cpu_manager_pinning_requests", "The number of cpu core allocations which "
            "required pinning."))
        self.cpu_errors = r.register(Counter(
            f"{PREFIX}_cpu_manager_pinning_errors", "The number of cpu core allocations which "
            "required pinning failed."))
        self.memory_requests = r.register(Counter(
            f"{PREFIX}_memory_manager_pinning_requests", "The number of memory pages allocations "
            "which required pinning."))
        self.memory_errors = r.register(Counter(
            f"{PREFIX}_memory_manager_pinning_errors", "The number of memory pages allocations "
            "which required pinning failed."))
        self.stale_choices = r.register(Counter(
            f"{PREFIX}_scheduled_numa_nodes_stale", "The number of containers whose pod's "
            "scheduled NUMA nodes (numa.nri.io/scheduled-numa-nodes) no longer held them: "
            "decided anew."))
        self.cpuset_repairs = r.register(Counter(
            f"{PREFIX}_cpuset_repairs", "The number of cpusets sent again to a started container "
            "whose cgroup missed an update."))
        self.aligned = r.register(LabelledCounter(
            f"{PREFIX}_container_aligned_compute_resources_count", "Cumulative number of aligned "
            "compute resources allocated to containers by alignment type.",
            ("boundary", "scope"), ALIGNED_SERIES, total=False))
        self.alignment_failures = r.register(LabelledCounter(
            f"{PREFIX}_container_aligned_compute_resources_failure_count", "Cumulative number of "
            "failures to allocate aligned compute resources to containers by alignment type.",
            ("boundary", "scope"), ALIGNMENT_FAILURE_SERIES, total=False))
        r.register(LedgerCollector(view, degraded))

    @contextmanager
    def admission(self) -> Iterator[None]:
        """Around one CreateContainer: counts it, times it, and counts it refused when it
        raises (the refusal itself goes on to the runtime)."""
        began = time.perf_counter()
        self.admission_requests.inc()
        try:
            yield
        except BaseException:
            self.admission_errors.inc()
            raise
        finally:
            self.admission_duration.observe((time.perf_counter() - began) * 1000)

    def decided(self, ctx: EngineContext, pod: PodRequest, request: ContainerRequest,
                decision: Decision, steps: Sequence[MergeStep] = ()) -> None:
        if decision.preferred_numa is not None and not decision.preferred_numa.honoured:
            self.stale_choices.inc()
        try:
            pinning = pinning_of(ctx, pod, request, decision)
            alignment = alignment_of(ctx, decision, pinning, steps)
        except Exception:  # a counter is never worth failing a container over
            log.exception("metrics: cannot classify the decision for %s", request.name)
            return
        for moved, counter in ((pinning.cpu_request, self.cpu_requests),
                               (pinning.cpu_error, self.cpu_errors),
                               (pinning.memory_request, self.memory_requests),
                               (pinning.memory_error, self.memory_errors)):
            if moved:
                counter.inc()
        for series in alignment.aligned:
            self.aligned.inc(series)
        for series in alignment.failed:
            self.alignment_failures.inc(series)

    def repaired(self) -> None:
        self.cpuset_repairs.inc()


class LedgerCollector:
    """Gauges read from the ledger at scrape time, per NUMA node."""

    def __init__(self, view: Callable[[], tuple[LedgerReader, Mapping[str, ContainerRecord]]],
                 degraded: Callable[[], int] | None = None) -> None:
        self._view = view
        self._degraded = degraded

    def collect(self) -> Iterator[MetricFamily]:
        try:
            families = ledger_families(*self._view())
            if self._degraded is not None:
                families.append(degraded_family(self._degraded()))
        except Exception:  # a scrape must not take the server thread down
            log.exception("metrics: cannot read the ledger for a scrape")
            return iter(())
        return iter(families)


def ledger_families(ledger: LedgerReader,
                    containers: Mapping[str, ContainerRecord]) -> list[MetricFamily]:
    ctx, allocs = ledger.ctx, ledger.allocations  # one immutable snapshot for the whole scrape
    node_label = ["numa_node"]
    free_cpus = gauge_family(
        f"{PREFIX}_numa_node_free_cpus", "CPUs of the node that can still be given to a "
        "container exclusively: in the shared pool, not reserved and not isolated.", node_label)
    cpus = gauge_family(
        f"{PREFIX}_numa_node_cpus", "CPUs of the node held exclusively by containers, and in "
        "the shared pool.", ["numa_node", "pool"])
    isolated = gauge_family(
        f"{PREFIX}_numa_node_isolated_cpus", "Isolated CPUs (isolcpus) of the node: held "
        "exclusively by containers that asked for them, and free.", ["numa_node", "state"])
    exclusive = allocs.exclusive_cpus()
    for node in ctx.topology.numa_nodes:
        on_node, label = frozenset(node.cpus), str(node.id)
        free_cpus.add([label], len((allocs.shared & on_node) - ctx.reserved_cpus
                                   - ctx.isolated_cpus))
        cpus.add([label, "exclusive"], len(exclusive & on_node))
        cpus.add([label, "shared"], len(allocs.shared & on_node))
        isolated_here = ctx.isolated_cpus & on_node
        isolated.add([label, "exclusive"], len(isolated_here & exclusive))
        isolated.add([label, "free"], len(isolated_here - exclusive - ctx.reserved_cpus))
    families: list[MetricFamily] = [free_cpus, cpus, isolated, *_cpu_manager_families(ctx, allocs)]
    if allocs.memory is not None:
        families.extend(_memory_families(allocs.memory))
    if ctx.devices:
        families.append(_device_family(ctx, allocs))
    managed = gauge_family(f"{PREFIX}_containers", "Containers the plugin manages, by "
                           "where their CPUs come from.", ["cpus"])
    held = sum(1 for c in containers.values() if c.exclusive)
    managed.add(["exclusive"], held)
    managed.add(["shared"], len(containers) - held)
    families.append(managed)
    return families


def _cpu_manager_families(ctx: EngineContext, allocs: Allocations) -> list[MetricFamily]:
    """The static CPU policy's gauges (cpumanager policy_static initializeMetrics,
    updateMetricsOnAllocate/Release). Without the static policy the kubelet never sets them:
    both sizes read 0 and no node is shown."""
    pool = gauge_family(f"{PREFIX}_cpu_manager_shared_pool_size_millicores", "The size of the "
                        "shared CPU pool for non-guaranteed QoS pods, in millicores.")
    exclusive = gauge_family(f"{PREFIX}_cpu_manager_exclusive_cpu_allocation_count", "The total "
                             "number of CPUs exclusively allocated to containers running on "
                             "this node")
    per_numa = gauge_family(f"{PREFIX}_cpu_manager_allocation_per_numa", "Number of CPUs "
                            "allocated per NUMA node", ["numa_node"])
    if not ctx.cpu_static:
        pool.add((), 0)
        exclusive.add((), 0)
        return [pool, exclusive, per_numa]
    held = allocs.exclusive_cpus()
    # GetAvailableCPUs: the default (shared) set less the reserved CPUs.
    pool.add((), len(allocs.shared - ctx.reserved_cpus) * 1000)
    exclusive.add((), len(held))
    for node in ctx.topology.numa_nodes:
        if node.cpus:
            per_numa.add([str(node.id)], len(held & frozenset(node.cpus)))
    return [pool, exclusive, per_numa]


def degraded_family(count: int) -> MetricFamily:
    family = gauge_family(
        f"{PREFIX}_degraded_containers", "Guaranteed containers running in the shared pool "
        "without the exclusive CPUs (or memory nodes) the kubelet would give them: adopted "
        "while those were taken, moved onto them as soon as room appears.")
    family.add((), count)
    return family


def _memory_families(memory: MemoryState) -> list[MetricFamily]:
    """Only under the Static memory policy: without it the ledger does not account memory."""
    from nri_numa.engine.memory.resources import MEMORY
    from nri_numa.engine.quantity import bytes_value

    free_memory = gauge_family(
        f"{PREFIX}_numa_node_free_memory_bytes", "Memory of the node not assigned to a "
        "container (allocatable minus assigned; Static memory policy).", ["numa_node"])
    free_pages = gauge_family(
        f"{PREFIX}_numa_node_free_hugepages", "Hugepages of one size of the node not assigned "
        "to a container (Static memory policy).", ["numa_node", "page_size"])
    for node_id, node in memory.nodes.items():
        for resource, table in node.tables.items():
            if resource == MEMORY:
                free_memory.add([str(node_id)], table.free)
            else:
                size = resource.removeprefix("hugepages-")
                free_pages.add([str(node_id), size], table.free // bytes_value(size))
    return [free_memory, free_pages]


def _device_family(ctx: EngineContext, allocs: Allocations) -> MetricFamily:
    free = gauge_family(
        f"{PREFIX}_numa_node_free_devices", "Healthy devices of a resource on the node not "
        "assigned to a container (numa_node \"none\": devices that name no node).",
        ["numa_node", "resource"])
    for name, resource in sorted(ctx.devices.items()):
        in_use = allocs.devices_in_use(name)
        counts = {str(n): 0 for n in ctx.numa_ids}
        for device in resource.devices:
            for node in device.numa_nodes or ("none",):
                key = str(node)
                counts[key] = counts.get(key, 0) + (device.healthy and device.id not in in_use)
        for node, count in counts.items():
            free.add([node, name], count)
    return free


class MetricsServer:
    """``/metrics`` over HTTP on its own daemon thread (metrics_http; each scrape is served on a
    thread of its own too)."""

    def __init__(self, metrics: PluginMetrics, address: MetricsAddress) -> None:
        from nri_numa.agent.metrics_http import serve

        registry = metrics.registry
        try:
            self._server, self._thread = serve(
                address.host, address.port, lambda: exposition(registry.collect()).encode(),
                CONTENT_TYPE)
        except OSError as e:  # in use, not ours, or a host name that does not resolve
            raise MetricsError(f"metrics address {address}: cannot listen: "
                               f"{e.strerror or e}") from None
        except ValueError as e:  # a host name that cannot even be asked for (IDNA, NUL)
            raise MetricsError(f"metrics address {address}: {e}") from None
        host, port = self._server.server_address[:2]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
