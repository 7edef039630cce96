"""The plugin's Prometheus metrics on real containerd 1.7 and 2.1: scraped over HTTP while pods
run, the kubelet's counters moving by one per CreateContainer (and per refusal), and the gauges
agreeing with the cgroups the containers got."""

from __future__ import annotations

import re
import urllib.request
from contextlib import nullcontext

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness.cgroups import CgroupLayout
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod
from tests.e2e.harness.image import BuiltImage
from tests.e2e.harness.timing import StepTimes
from tests.e2e.nri_agent import (BESTEFFORT, BOTH, EXCLUSIVE, GUARANTEED_1, GUARANTEED_2,
                                 SHARED_ONLY, Agent, agent, cgroup_cpus, run, start_and_connect)

__all__ = ["agent"]  # the fixture, imported for pytest
pytestmark = pytest.mark.e2e

REQUESTS = "nri_numa_topology_manager_admission_requests_total"
ERRORS = "nri_numa_topology_manager_admission_errors_total"
DURATIONS = "nri_numa_topology_manager_admission_duration_ms_count"
PINNING = "nri_numa_cpu_manager_pinning_requests_total"
PINNING_ERRORS = "nri_numa_cpu_manager_pinning_errors_total"
# The kubelet's counter is named without _total; prometheus_client's parser adds it to samples.
NUMA_ALIGNED = ("nri_numa_container_aligned_compute_resources_count_total"
                "{boundary=numa_node}{scope=container}")
NUMA_ALIGNMENT_FAILED = ("nri_numa_container_aligned_compute_resources_failure_count_total"
                         "{boundary=numa_node}{scope=container}")
COUNTERS = (REQUESTS, ERRORS, DURATIONS, PINNING, PINNING_ERRORS, NUMA_ALIGNED,
            NUMA_ALIGNMENT_FAILED)
POOL = "nri_numa_cpu_manager_shared_pool_size_millicores"
HELD = "nri_numa_cpu_manager_exclusive_cpu_allocation_count"


class Scraper:
    def __init__(self, agent: Agent, step_times: StepTimes, version: str) -> None:
        agent.wait_log("metrics served on")
        self.url = re.search(r"metrics served on (\S+)", agent.log_text()).group(1)
        self.step_times, self.version = step_times, version

    def scrape(self, timed: bool = False) -> dict[str, float]:
        with self.step_times.step(self.version, "metrics scrape") if timed else nullcontext():
            with urllib.request.urlopen(self.url, timeout=5) as response:
                text = response.read().decode()
        return {s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def counters(self) -> tuple[int, ...]:
        got = self.scrape()
        return tuple(int(got[name]) for name in COUNTERS)


def node0(got: dict[str, float], name: str, **labels: str) -> int:
    key = f"nri_numa_{name}{{numa_node=0}}" + "".join(f"{{{k}={v}}}" for k, v in labels.items())
    return int(got[key])


def moved(before: tuple[int, ...], after: tuple[int, ...]) -> dict[str, int]:
    return {name: b - a for name, a, b in zip(COUNTERS, before, after) if b != a}


def test_metrics_follow_real_containers(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent, step_times: StepTimes) -> None:
    agent.extra_args = ("--metrics-address", "127.0.0.1:0")  # a free port: tests run side by side
    start_and_connect(containerd, agent)
    scraper = Scraper(agent, step_times, containerd.version)
    start = scraper.counters()
    got = scraper.scrape()
    assert node0(got, "numa_node_free_cpus") == 1  # CPU 1; CPU 0 is reserved
    assert node0(got, "numa_node_cpus", pool="shared") == 2
    assert node0(got, "numa_node_cpus", pool="exclusive") == 0
    assert (got[POOL], got[HELD]) == (1000, 0)  # CPU 1: CPU 0 is reserved
    assert node0(got, "cpu_manager_allocation_per_numa") == 0

    shared = run(cri_client, Pod("be", (BESTEFFORT,)), busybox_image)
    after_be = scraper.counters()
    # Admitted, nothing pinned; single-numa-node aligns every container, as the kubelet counts.
    assert moved(start, after_be) == {REQUESTS: 1, DURATIONS: 1, NUMA_ALIGNED: 1}

    g = Pod("g", (GUARANTEED_1,))
    g_sandbox = cri_client.run_pod(g)
    guaranteed = cri_client.create_container(g_sandbox, g.container_config("work",
                                                                           busybox_image.ref))
    cri_client.start_container(guaranteed)
    after_g = scraper.counters()
    assert moved(after_be, after_g) == {REQUESTS: 1, DURATIONS: 1, PINNING: 1, NUMA_ALIGNED: 1}
    got = scraper.scrape(timed=True)
    exclusive_cgroup = cgroup_cpus(cri_client, cgroup_layout, guaranteed)
    shared_cgroup = cgroup_cpus(cri_client, cgroup_layout, shared)
    assert (exclusive_cgroup, shared_cgroup) == (EXCLUSIVE, SHARED_ONLY)
    assert node0(got, "numa_node_cpus", pool="exclusive") == len(exclusive_cgroup)
    assert node0(got, "numa_node_cpus", pool="shared") == len(shared_cgroup)
    assert node0(got, "numa_node_free_cpus") == 0
    assert got["nri_numa_containers{cpus=exclusive}"] == 1
    assert got["nri_numa_containers{cpus=shared}"] == 1
    assert (got[POOL], got[HELD]) == (0, 1)
    assert node0(got, "cpu_manager_allocation_per_numa") == 1

    big = Pod("big", (GUARANTEED_2,))
    big_sandbox = cri_client.run_pod(big)
    with pytest.raises(grpc.RpcError):
        cri_client.create_container(big_sandbox, big.container_config("work", busybox_image.ref))
    after_refusal = scraper.counters()
    # Refused by the topology merge: the CPU manager was never asked, as in the kubelet.
    assert moved(after_g, after_refusal) == {REQUESTS: 1, ERRORS: 1, DURATIONS: 1,
                                             NUMA_ALIGNMENT_FAILED: 1}

    cri_client.stop_pod(g_sandbox)
    cri_client.remove_pod(g_sandbox)
    got = scraper.scrape()
    assert cgroup_cpus(cri_client, cgroup_layout, shared) == BOTH
    assert node0(got, "numa_node_cpus", pool="shared") == len(BOTH)
    assert node0(got, "numa_node_cpus", pool="exclusive") == 0
    assert node0(got, "numa_node_free_cpus") == 1
    assert (got[POOL], got[HELD]) == (1000, 0)
    assert scraper.counters() == after_refusal  # releases are not admissions
