"""Upgrades and removal lose nothing: the DaemonSet rolled from image A to image B (two builds
that differ, tests/e2e_k8s_install/conftest.py) while pods are created and deleted, then the
DaemonSet deleted. Measured: the longest time without an agent (containerd's log: the old
agent's connection closed → the new one connected), the containers created meanwhile, the
refusals, and how long each of those containers ran on g-hold's exclusive CPU (the runtime's
default cpuset, every CPU, until the new agent's Synchronize moved it; cgroup cpusets sampled
through the rollout). Checked: that exposure within the gap (docs/install.md, "Updates"), no
container refused, every container on the CPUs its class gives (a container created while no
agent ran is adopted by the new agent's Synchronize and moved to the shared pool, so no
exclusive CPU is held twice), the NodeResourceTopology never deleted nor wrong for more than 1 s
after the new agent is up; and after the deletion, the running containers exactly where they
were."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

import grpc
import pytest

from nri_numa.cluster.nrt import available_cpus
from tests.e2e.harness.cgroups import CgroupLayout, container_cgroup_path, read_cpuset
from tests.e2e.cri import api_pb2 as cri
from tests.e2e_k8s.daemonset import NAME, NAMESPACE, agent_pods, running_agent
from tests.e2e_k8s.kube import Json, Kube, wait_for
from tests.e2e_k8s.lab import NODE_NAME, Lab
from tests.e2e_k8s.pods import container_cpus, pod_manifest, wait_running
from tests.e2e_k8s_install.conftest import IMAGE_B

pytestmark = pytest.mark.k8s
NRT_PATH = f"/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/{NODE_NAME}"
WRONG_AFTER_UP_S = 1.0
CHURN_EVERY_S = 1.0
# Churned pods alive at a time, older ones deleted: some made while no agent ran still run at
# the end, where their CPUs show the new agent's adoption.
ALIVE = 8
ROLLOUT_S = 120.0
HELD_CPU = 1  # g-hold's exclusive CPU (CPU 0 is reserved)
SAMPLE_EVERY_S = 0.1
EVENT = re.compile(r'time="([^"]+)".*(connection to plugin \\"90-nri-numa\\" closed'
                   r'|plugin \\"90-nri-numa\\" connected)')


def nrt(kube: Kube) -> Json | None:
    return kube.get_if_present(NRT_PATH)


def containerd_times(lab: Lab, after: float) -> list[tuple[float, str]]:
    """(UNIX time, "closed" | "connected") of nri-numa's NRI connections after ``after``."""
    found = []
    for line in (lab.logs / "containerd.log").read_text(errors="replace").splitlines():
        if match := EVENT.search(line):
            stamp = datetime.fromisoformat(match[1][:26].rstrip("Z") + "+00:00").timestamp()
            if stamp >= after:
                found.append((stamp, "closed" if "closed" in match[2] else "connected"))
    return found


def running_containers(lab: Lab) -> dict[str, tuple[str, float]]:
    """Container id → (pod name, UNIX time created) of every running container of a pod of the
    default namespace."""
    client = lab.cri()
    try:
        return {c.id: (c.labels["io.kubernetes.pod.name"], c.created_at / 1e9)
                for c in client.list_containers() if c.state == cri.CONTAINER_RUNNING
                and c.labels.get("io.kubernetes.pod.namespace") == "default"}
    finally:
        client.close()


@dataclass
class CpusetSamples:
    """Sweeps over every running container's cgroup cpuset.cpus but g-hold's: when each sweep
    began, and what it read (container id → CPUs); each container's pod and creation time."""

    sweeps: list[tuple[float, dict[str, frozenset[int]]]] = field(default_factory=list)
    created: dict[str, tuple[str, float]] = field(default_factory=dict)

    def sample(self, lab: Lab, layout: CgroupLayout, stop: threading.Event) -> None:
        """Sweeps every SAMPLE_EVERY_S until ``stop``."""
        client = lab.cri()
        paths: dict[str, str] = {}
        try:
            while not stop.is_set():
                began, read = time.time(), {}
                for c in client.list_containers():
                    pod = c.labels.get("io.kubernetes.pod.name", "")
                    if c.state != cri.CONTAINER_RUNNING or pod == "g-hold":
                        continue
                    try:
                        if c.id not in paths:
                            paths[c.id] = container_cgroup_path(client.container_info(c.id))
                            self.created[c.id] = (pod, c.created_at / 1e9)
                        read[c.id] = read_cpuset(layout, paths[c.id]).cpu_ids
                    except (OSError, grpc.RpcError):
                        continue  # stopped and removed since the listing
                self.sweeps.append((began, read))
                stop.wait(SAMPLE_EVERY_S)
        finally:
            client.close()

    def on_held_cpu(self, container_id: str) -> float | None:
        """At most how long the container ran with HELD_CPU in its cpuset: from its creation to
        the first sweep, after one that read it, that found it without HELD_CPU or stopped.
        None: no sweep read it, or none after it found it moved or stopped."""
        created = self.created[container_id][1]
        seen = False
        for began, read in self.sweeps:
            if container_id in read and HELD_CPU in read[container_id]:
                seen = True
            elif seen or container_id in read:
                return began - created
        return None

    def longest_interval(self) -> float:
        """The longest time between two sweeps' beginnings: how late a sweep can find a change."""
        starts = [began for began, _ in self.sweeps]
        return max((b - a for a, b in zip(starts, starts[1:])), default=0.0)


def test_a_rolling_update_loses_no_container_and_the_deletion_moves_none(
        lab: Lab, kube: Kube, layout: CgroupLayout) -> None:
    kube.apply([pod_manifest("g-hold", cpu="1", memory="64Mi"), pod_manifest("be-before")])
    wait_running(kube, ["g-hold", "be-before"])
    expected_available = 0  # CPU 0 reserved, CPU 1 g-hold's
    wait_for(lambda: (o := nrt(kube)) is not None and available_cpus(o) == expected_available,
             10.0, "the object showing CPU 1 taken")
    old_agent = running_agent(kube)["metadata"]["name"]

    stop = threading.Event()
    churned: list[str] = []
    churned_at: list[float] = []
    samples: list[tuple[float, Json | None]] = []

    def churn() -> None:
        n = 0
        while not stop.is_set():
            name = f"churn-{n}"
            kube.apply([pod_manifest(name)])
            churned.append(name)
            churned_at.append(time.time())
            if n >= ALIVE:
                kube.delete_pod(f"churn-{n - ALIVE}")
            n += 1
            stop.wait(CHURN_EVERY_S)

    def watch_nrt() -> None:
        while not stop.is_set():
            samples.append((time.time(), nrt(kube)))
            stop.wait(0.1)

    cpusets = CpusetSamples()
    threads = [threading.Thread(target=churn, daemon=True),
               threading.Thread(target=watch_nrt, daemon=True),
               threading.Thread(target=cpusets.sample, args=(lab, layout, stop), daemon=True)]
    began = time.time()
    for thread in threads:
        thread.start()
    try:
        time.sleep(2 * CHURN_EVERY_S)
        rollout_began = time.time()
        print(kube.kubectl("-n", NAMESPACE, "set", "image", f"daemonset/{NAME}", f"{NAME}={IMAGE_B}"))
        print(kube.kubectl("-n", NAMESPACE, "rollout", "status", f"daemonset/{NAME}",
                           f"--timeout={int(ROLLOUT_S)}s", timeout_s=ROLLOUT_S + 10))
        new = wait_for(lambda: (p := running_agent(kube)) and p["metadata"]["name"] != old_agent
                       and p, 30.0, "the new agent pod running")
        assert new["spec"]["containers"][0]["image"] == IMAGE_B
        events = wait_for(lambda: (e := containerd_times(lab, began)) and e[-1][1] == "connected"
                          and e, 30.0, "containerd to connect the new agent")
        time.sleep(3 * CHURN_EVERY_S)  # pods made after the new agent is up too
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    rolled = time.time() - began

    gaps, down_since = [], None
    for t, what in events:
        if what == "closed" and down_since is None:
            down_since = t
        elif what == "connected" and down_since is not None:
            gaps.append(t - down_since)
            down_since = None
    gap, up_at = max(gaps), events[-1][0]
    during = [t for t in churned_at if rollout_began <= t <= up_at]
    alive = [n for n in churned
             if (p := kube.pod(n)) is not None and not p["metadata"].get("deletionTimestamp")]
    wait_running(kube, alive)
    failed = [e for e in kube.get("/api/v1/namespaces/default/events")["items"]
              if e["type"] == "Warning" and e["reason"] in ("Failed", "TopologyAffinityError")
              and e["involvedObject"]["name"] in [*churned, "g-hold", "be-before"]]
    missing = [t for t, obj in samples if obj is None]
    wrong_after_up = longest_run([(t, obj is None or available_cpus(obj) != expected_available)
                                  for t, obj in samples if t >= up_at])
    print(f"rollout {rolled:.1f} s: {len(events)} NRI connection events, longest gap without an "
          f"agent {gap:.2f} s, {len(during)} pods created from `set image` to the new agent up "
          f"({len(churned)} in all), {len(failed)} refusals; "
          f"NodeResourceTopology missing in {len(missing)} of {len(samples)} samples, wrong for "
          f"at most {wrong_after_up:.2f} s after the new agent was up")
    assert gap < rolled
    assert not failed, [(e["involvedObject"]["name"], e["message"]) for e in failed]
    assert not missing
    assert wrong_after_up <= WRONG_AFTER_UP_S
    made_without_agent = [name for name, created in running_containers(lab).values()
                          if up_at - gaps[-1] < created < up_at]
    print(f"running containers made while no agent ran: {sorted(made_without_agent)}")
    assert made_without_agent  # the check below covers the new agent's adoptions

    # Each container made while no agent ran had every CPU, g-hold's too, until the new agent's
    # Synchronize moved it. containerd logs "connected" only after it applied the updates that
    # Synchronize returned (the NRI adaptation's syncFn, then that line), so no container made
    # in the gap kept HELD_CPU past up_at: its exposure is within the gap, found by the sweeps
    # at most one interval between two sweeps late.
    in_gap = [cid for cid, (_, created) in cpusets.created.items() if up_at - gaps[-1] < created < up_at]
    exposed = {cid: cpusets.on_held_cpu(cid) for cid in in_gap}
    unresolved = [cpusets.created[cid][0] for cid, took in exposed.items() if took is None]
    assert not unresolved, f"never read, or never read moved or stopped: {unresolved}"
    longest, late = max(exposed.values(), default=0.0), cpusets.longest_interval()
    each = ", ".join(f"{cpusets.created[cid][0]} {took:.2f} s"
                     for cid, took in sorted(exposed.items(), key=lambda e: -e[1]))
    print(f"{len(in_gap)} containers made while no agent ran, on CPU {HELD_CPU} (g-hold's) at "
          f"most {longest:.2f} s ({each}); the gap {gaps[-1]:.2f} s, sweeps at most {late:.2f} s "
          f"apart ({len(cpusets.sweeps)} sweeps)")
    assert in_gap
    assert longest <= gaps[-1] + late
    placements = check_placements(lab, layout)

    # The deletion: the agent goes, every container stays where it is.
    print(kube.kubectl("-n", NAMESPACE, "delete", "daemonset", NAME, "--wait=true", timeout_s=90))
    wait_for(lambda: not agent_pods(kube), 60.0, "the agent pod gone")
    assert nrt(kube) is not None  # owned by the Node, not by the DaemonSet
    assert check_placements(lab, layout) == placements


def check_placements(lab: Lab, layout: CgroupLayout) -> dict[str, frozenset[int]]:
    """Every running container of the default namespace: g-hold on CPU 1, every other on the
    shared pool (CPU 0) — none on CPU 1 beside g-hold. Container id → CPUs."""
    names = {cid: name for cid, (name, _) in running_containers(lab).items()}
    placements = {cid: container_cpus(lab, layout, cid) for cid in names}
    wrong = {names[c]: sorted(cpus) for c, cpus in placements.items()
             if cpus != ({1} if names[c] == "g-hold" else {0})}
    assert not wrong, f"containers on the wrong CPUs: {wrong}"
    return placements


def longest_run(flags: list[tuple[float, bool]]) -> float:
    """The longest time the flag stayed set, over samples (time, flag) in order."""
    longest, start = 0.0, None
    for t, flag in flags:
        if flag and start is None:
            start = t
        elif not flag and start is not None:
            longest, start = max(longest, t - start), None
    if start is not None and flags:
        longest = max(longest, flags[-1][0] - start)
    return longest
