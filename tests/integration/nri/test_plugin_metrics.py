"""Metrics of the real plugin: the kubelet's counters moving with real handler calls, gauges read
from the ledger, served over a real HTTP socket and parsed with Prometheus's own text parser."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from nri_numa.agent.metrics import MetricsError, MetricsServer, PluginMetrics
from nri_numa.agent.settings import MetricsAddress
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.nri.session import PluginError
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import CONFIG, GIB, create, machine

STATIC_MEMORY = {"memoryManagerPolicy": "Static",
                 "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}},
                                    {"numaNode": 1, "limits": {"memory": "1Gi"}}]}


def plugin_with_metrics(**config) -> tuple[NumaPlugin, PluginMetrics]:
    holder: list[NumaPlugin] = []
    metrics = PluginMetrics(lambda: (holder[0].ledger, holder[0].containers))
    plugin = NumaPlugin(machine(), config_from_mapping({**CONFIG, **config}), metrics=metrics)
    holder.append(plugin)
    return plugin, metrics


def samples(metrics: PluginMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the registry, by name and sorted labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in metrics.registry.collect() for s in family.samples}


def value(metrics: PluginMetrics, name: str, **labels: str) -> float:
    return samples(metrics)[(f"nri_numa_{name}", tuple(sorted(labels.items())))]


COUNTERS = ("topology_manager_admission_requests_total", "topology_manager_admission_errors_total",
            "cpu_manager_pinning_requests_total", "cpu_manager_pinning_errors_total",
            "memory_manager_pinning_requests_total", "memory_manager_pinning_errors_total")


def counters(metrics: PluginMetrics) -> tuple[int, ...]:
    return tuple(int(value(metrics, name)) for name in COUNTERS)


def refused(plugin: NumaPlugin, sandbox: api.PodSandbox, c: api.Container) -> str:
    with pytest.raises(PluginError) as e:
        create(plugin, sandbox, c)
    return str(e.value)


def test_counters_move_as_the_kubelets_do():
    plugin, metrics = plugin_with_metrics()
    assert counters(metrics) == (0, 0, 0, 0, 0, 0)
    be = msg.pod("be", "besteffort")
    create(plugin, be, msg.container(be, "app"))
    assert counters(metrics) == (1, 0, 0, 0, 0, 0)  # admitted, nothing pinned
    g = msg.pod("g")
    create(plugin, g, msg.guaranteed(g, "app", cpus=2))
    assert counters(metrics) == (2, 0, 1, 0, 0, 0)  # exclusive CPUs: one pinning request
    big = msg.pod("big")
    assert "TopologyAffinityError" in refused(plugin, big, msg.guaranteed(big, "app", cpus=5))
    # Refused by the merge: the CPU manager was never asked to allocate.
    assert counters(metrics) == (3, 1, 1, 0, 0, 0)
    assert value(metrics, "topology_manager_admission_duration_ms_count") == 3


def test_a_failed_cpu_allocation_counts_a_pinning_error():
    plugin, metrics = plugin_with_metrics(topologyManagerPolicy="none")
    big = msg.pod("big")
    refused(plugin, big, msg.guaranteed(big, "app", cpus=8))  # 8 CPUs, one of them reserved
    assert counters(metrics) == (1, 1, 1, 1, 0, 0)


def test_memory_pinning_under_the_static_memory_policy():
    plugin, metrics = plugin_with_metrics(topologyManagerPolicy="none", **STATIC_MEMORY)
    g, burstable = msg.pod("g"), msg.pod("b", "burstable")
    create(plugin, g, msg.guaranteed(g, "app", cpus=1))
    create(plugin, burstable, msg.container(burstable, "app", cpu=500))
    assert counters(metrics) == (2, 0, 1, 0, 1, 0)  # only the Guaranteed one is pinned
    huge = msg.pod("huge")
    refused(plugin, huge, msg.guaranteed(huge, "app", cpus=1, memory=200 * GIB))
    assert counters(metrics) == (3, 1, 2, 0, 2, 1)


def test_a_container_that_cannot_be_read_counts_as_an_admission_error():
    plugin, metrics = plugin_with_metrics()
    g = msg.pod("g")
    bad = msg.guaranteed(g, "app", cpus=1, devices=[("/dev/odd", "x", 1, 1)])
    with pytest.raises(PluginError, match="cannot read container"):
        create(plugin, g, bad)
    assert counters(metrics)[:2] == (1, 1)


def test_gauges_follow_the_ledger():
    plugin, metrics = plugin_with_metrics(**STATIC_MEMORY)
    assert [value(metrics, "numa_node_free_cpus", numa_node=n) for n in "01"] == [3, 4]
    assert value(metrics, "numa_node_free_devices", numa_node="1",
                 resource="nvidia.com/gpu") == 1
    free_memory = value(metrics, "numa_node_free_memory_bytes", numa_node="1")
    g = msg.pod("g")
    reply = create(plugin, g, msg.guaranteed(g, "app", cpus=4, memory=2 * GIB))
    node = str(int(reply.adjust.linux.resources.cpu.cpus.split("-")[0]) // 4)
    assert node == "1"  # node 0 has only three CPUs that are not reserved
    assert value(metrics, "numa_node_free_cpus", numa_node="1") == 0
    assert value(metrics, "numa_node_cpus", numa_node="1", pool="exclusive") == 4
    assert value(metrics, "numa_node_cpus", numa_node="1", pool="shared") == 0
    assert value(metrics, "numa_node_cpus", numa_node="0", pool="shared") == 4
    assert value(metrics, "numa_node_free_memory_bytes", numa_node="1") == free_memory - 2 * GIB
    assert value(metrics, "containers", cpus="exclusive") == 1
    plugin.stop_container(api.StopContainerRequest(pod=g, container=msg.guaranteed(g, "app", 4)))
    assert value(metrics, "numa_node_free_cpus", numa_node="1") == 4
    assert value(metrics, "numa_node_free_memory_bytes", numa_node="1") == free_memory


def test_without_the_static_memory_policy_no_memory_gauges():
    _, metrics = plugin_with_metrics()
    names = {name for name, _ in samples(metrics)}
    assert "nri_numa_numa_node_free_cpus" in names
    assert "nri_numa_numa_node_free_memory_bytes" not in names


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {f"{s.name}{sorted(s.labels.items())}": s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_served_over_http_and_never_waiting_for_a_handler():
    plugin, metrics = plugin_with_metrics()
    server = MetricsServer(metrics, MetricsAddress("127.0.0.1", 0))
    try:
        g = msg.pod("g")
        create(plugin, g, msg.guaranteed(g, "app", cpus=1))
        got = scrape(server.url)
        assert got["nri_numa_topology_manager_admission_requests_total[]"] == 1
        assert got["nri_numa_cpu_manager_pinning_requests_total[]"] == 1
        assert got["nri_numa_numa_node_free_cpus[('numa_node', '0')]"] == 2
        # A handler holding the plugin's lock does not hold up a scrape.
        with plugin._lock:
            began = time.monotonic()
            scrape(server.url)
            assert time.monotonic() - began < 2
    finally:
        server.stop()


def test_a_broken_ledger_view_costs_the_gauges_not_the_scrape(caplog):
    metrics = PluginMetrics(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    metrics.admission_requests.inc()
    server = MetricsServer(metrics, MetricsAddress("127.0.0.1", 0))
    try:
        got = scrape(server.url)
    finally:
        server.stop()
    assert got["nri_numa_topology_manager_admission_requests_total[]"] == 1
    assert not any("free_cpus" in k for k in got)
    assert "cannot read the ledger" in caplog.text


def test_an_address_in_use_is_named():
    _, metrics = plugin_with_metrics()
    first = MetricsServer(metrics, MetricsAddress("127.0.0.1", 0))
    try:
        port = int(first.url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(MetricsError, match=f"metrics address 127.0.0.1:{port}: cannot listen"):
            MetricsServer(metrics, MetricsAddress("127.0.0.1", port))
    finally:
        first.stop()


def test_counting_is_safe_from_many_threads():
    plugin, metrics = plugin_with_metrics(topologyManagerPolicy="none")

    def burst(i: int) -> None:
        sandbox = msg.pod(f"be{i}", "besteffort")
        for j in range(20):
            create(plugin, sandbox, msg.container(sandbox, f"c{j}"))

    threads = [threading.Thread(target=burst, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counters(metrics)[:2] == (80, 0)


# The kubelet's resource-manager metrics (pkg/kubelet/metrics/metrics.go, 1.32-1.36): the family
# name as prometheus_client's parser gives it (a counter's without _total), its type, its labels.
KUBELET_FAMILIES = {
    "topology_manager_admission_requests": ("counter", set()),
    "topology_manager_admission_errors": ("counter", set()),
    "topology_manager_admission_duration_ms": ("histogram", {"le"}),
    "cpu_manager_pinning_requests": ("counter", set()),
    "cpu_manager_pinning_errors": ("counter", set()),
    "cpu_manager_shared_pool_size_millicores": ("gauge", set()),
    "cpu_manager_exclusive_cpu_allocation_count": ("gauge", set()),
    "cpu_manager_allocation_per_numa": ("gauge", {"numa_node"}),
    "memory_manager_pinning_requests": ("counter", set()),
    "memory_manager_pinning_errors": ("counter", set()),
    "container_aligned_compute_resources_count": ("counter", {"boundary", "scope"}),
    "container_aligned_compute_resources_failure_count": ("counter", {"boundary", "scope"}),
}
KUBELET_ADMISSION_BUCKETS = [0.05 * 2 ** i for i in range(15)]  # ExponentialBuckets(.05, 2, 15)


def scrape_families(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(families: dict, family: str, **labels: str) -> float:
    (found,) = [s.value for s in families[f"nri_numa_{family}"].samples
                if s.labels == labels and not s.name.endswith(("_created", "_bucket"))]
    return found


def aligned(families: dict, boundary: str, scope: str, failure: bool = False) -> float:
    name = "container_aligned_compute_resources_" + ("failure_count" if failure else "count")
    return sample(families, name, boundary=boundary, scope=scope)


def test_the_kubelets_resource_manager_metrics_in_one_scrape():
    plugin, metrics = plugin_with_metrics(
        cpuManagerPolicyOptions={"full-pcpus-only": "true"}, **STATIC_MEMORY)
    server = MetricsServer(metrics, MetricsAddress("127.0.0.1", 0))
    try:
        families = scrape_families(server.url)
        for name, (kind, labels) in KUBELET_FAMILIES.items():
            family = families[f"nri_numa_{name}"]
            assert family.type == kind, name
            assert {k for s in family.samples for k in s.labels} == labels, name
        buckets = [float(s.labels["le"]) for s in
                   families["nri_numa_topology_manager_admission_duration_ms"].samples
                   if s.name.endswith("_bucket")]
        assert buckets == pytest.approx(KUBELET_ADMISSION_BUCKETS + [float("inf")])
        # The series the kubelet adds with 0 at start are there before any container.
        for boundary, scope in (("numa_node", "container"), ("numa_node", "pod"),
                                ("physical_cpu", "container"), ("uncore_cache", "container")):
            assert aligned(families, boundary, scope) == 0
        assert aligned(families, "physical_cpu", "container", failure=True) == 0
        assert sample(families, "cpu_manager_shared_pool_size_millicores") == 7000  # 8 - reserved
        assert sample(families, "cpu_manager_exclusive_cpu_allocation_count") == 0
        assert [sample(families, "cpu_manager_allocation_per_numa", numa_node=n)
                for n in "01"] == [0, 0]

        g = msg.pod("g")
        reply = create(plugin, g, msg.guaranteed(g, "app", cpus=2))
        node = str(int(reply.adjust.linux.resources.cpu.cpus.split("-")[0]) // 4)
        families = scrape_families(server.url)
        assert sample(families, "cpu_manager_shared_pool_size_millicores") == 5000
        assert sample(families, "cpu_manager_exclusive_cpu_allocation_count") == 2
        assert sample(families, "cpu_manager_allocation_per_numa", numa_node=node) == 2
        assert sample(families, "cpu_manager_allocation_per_numa",
                      numa_node=str(1 - int(node))) == 0
        assert aligned(families, "numa_node", "container") == 1  # single-numa-node admitted
        assert aligned(families, "physical_cpu", "container") == 1  # full-pcpus-only
        assert aligned(families, "uncore_cache", "container") == 1  # one L3 per node here
        assert aligned(families, "numa_node", "pod") == 0

        big = msg.pod("big")
        refused(plugin, big, msg.guaranteed(big, "app", cpus=5))  # no node has 5
        families = scrape_families(server.url)
        assert aligned(families, "numa_node", "container", failure=True) == 1
        # Refused by the merge: the CPU manager was never asked, so no physical_cpu failure.
        assert aligned(families, "physical_cpu", "container", failure=True) == 0
        assert sample(families, "topology_manager_admission_errors") == 1

        plugin.stop_container(api.StopContainerRequest(pod=g,
                                                       container=msg.guaranteed(g, "app", 2)))
        families = scrape_families(server.url)
        assert sample(families, "cpu_manager_shared_pool_size_millicores") == 7000
        assert sample(families, "cpu_manager_exclusive_cpu_allocation_count") == 0
        assert sample(families, "cpu_manager_allocation_per_numa", numa_node=node) == 0
    finally:
        server.stop()


def test_pod_scope_counts_its_alignment_once_per_pod():
    plugin, metrics = plugin_with_metrics(topologyManagerScope="pod")
    g = msg.pod("g")
    create(plugin, g, msg.guaranteed(g, "first", cpus=1))
    create(plugin, g, msg.guaranteed(g, "second", cpus=1))
    assert metrics.aligned.value(("numa_node", "pod")) == 1  # the pod's one merge
    assert metrics.aligned.value(("numa_node", "container")) == 0
    big = msg.pod("big")
    refused(plugin, big, msg.guaranteed(big, "app", cpus=5))
    assert metrics.alignment_failures.value(("numa_node", "pod")) == 1


def test_alignment_is_counted_only_where_the_kubelet_guarantees_it():
    plugin, metrics = plugin_with_metrics(topologyManagerPolicy="restricted")
    g = msg.pod("g")
    create(plugin, g, msg.guaranteed(g, "app", cpus=2))
    # restricted is not IsAlignmentGuaranteed; no full-pcpus-only: no physical_cpu series moves.
    assert metrics.aligned.value(("numa_node", "container")) == 0
    assert metrics.aligned.value(("physical_cpu", "container")) == 0
    assert metrics.aligned.value(("uncore_cache", "container")) == 1


def test_an_exclusive_allocation_across_uncore_caches_is_not_uncore_aligned():
    plugin, metrics = plugin_with_metrics(topologyManagerPolicy="none")
    g = msg.pod("g")
    create(plugin, g, msg.guaranteed(g, "app", cpus=5))  # more than one node's L3
    assert metrics.aligned.value(("uncore_cache", "container")) == 0
    assert int(value(metrics, "cpu_manager_exclusive_cpu_allocation_count")) == 5


def test_a_device_that_cannot_be_had_stops_the_container_before_the_cpu_manager():
    plugin, metrics = plugin_with_metrics(topologyManagerPolicy="none")
    g = msg.pod("g")
    c = msg.guaranteed(g, "app", cpus=1)
    c.annotations["numa.nri.io/devices"] = "nvidia.com/gpu=2"  # one GPU on this machine
    text = refused(plugin, g, c)
    assert "nvidia.com/gpu" in text
    # The kubelet allocates devices, then CPUs, then memory: no CPU pinning was asked for.
    assert counters(metrics) == (1, 1, 0, 0, 0, 0)


def test_without_the_static_cpu_policy_the_cpu_manager_gauges_stay_at_zero():
    _, metrics = plugin_with_metrics(cpuManagerPolicy="none", reservedSystemCPUs="")
    assert value(metrics, "cpu_manager_shared_pool_size_millicores") == 0
    assert value(metrics, "cpu_manager_exclusive_cpu_allocation_count") == 0
    assert not any(name == "nri_numa_cpu_manager_allocation_per_numa"
                   for name, _ in samples(metrics))


def test_the_recording_rules_name_every_kubelet_series_under_the_kubelets_name():
    """packaging/prometheus/kubelet-recording-rules.yaml (docs/metrics.md): one rule per series
    name of the kubelet's metrics, recording nri_numa_X as kubelet_X with the kubelet's job."""
    rules_file = Path(__file__).parents[3] / "packaging/prometheus/kubelet-recording-rules.yaml"
    [group] = yaml.safe_load(rules_file.read_text())["groups"]
    rules = {rule["record"]: rule["expr"] for rule in group["rules"]}
    _, metrics = plugin_with_metrics()
    exported = {s.name for family in metrics.registry.collect()
                if family.name.removeprefix("nri_numa_") in KUBELET_FAMILIES
                or family.exposed_name.removeprefix("nri_numa_") in KUBELET_FAMILIES
                for s in family.samples}
    assert {f"kubelet_{name.removeprefix('nri_numa_')}" for name in exported} == set(rules)
    for name in exported:
        expr = rules[f"kubelet_{name.removeprefix('nri_numa_')}"]
        assert f'{name}{{job="nri-numa"}}' in expr
        assert '"job", "kubelet"' in expr and '"metrics_path", "/metrics"' in expr
