"""The node's NodeResourceTopology object on a real API server (docs/kubernetes.md): it shows this
machine, follows placements within a second, comes back after the agent restarts, is mended
when someone else edits it, and catches up after an API server outage that never slowed a
CreateContainer."""

from __future__ import annotations

import signal
import statistics
import time
from datetime import datetime

import pytest

from nri_numa.agent.inputs import read_config_file
from nri_numa.cluster.nrt import available_cpus, node_resource_topology
from nri_numa.engine.context import EngineContext
from nri_numa.topology import discover
from tests.e2e.harness.cgroups import CgroupLayout, remove_cgroups
from tests.e2e.harness.cri import Pod, Resources
from tests.e2e.harness.image import IMAGE_REF
from tests.e2e_k8s.kube import Json, Kube, wait_for
from tests.e2e_k8s.lab import NODE_NAME, NRT_RESYNC_S, Lab
from tests.e2e_k8s.pods import delete_and_wait_gone, pod_manifest, wait_running

pytestmark = pytest.mark.k8s
NRT_PATH = f"/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/{NODE_NAME}"
FOLLOW_S = 1.0  # the bound from a placement or release to the object showing it


def nrt(kube: Kube) -> Json | None:
    return kube.get_if_present(NRT_PATH)


def agent_log_time(lab: Lab, text: str) -> float:
    """When the agent logged the last line holding ``text`` (its lines start with local time)."""
    [line, *_] = [l for l in reversed(lab.agent_log.read_text(errors="replace").splitlines())
                  if text in l]
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def wait_available(kube: Kube, cpus: int, timeout_s: float) -> float:
    """Polls the object until it shows ``cpus`` available CPUs; when it first did (UNIX time)."""
    def shown() -> float | None:
        obj = nrt(kube)
        return time.time() if obj is not None and available_cpus(obj) == cpus else None
    return wait_for(shown, timeout_s, f"the NodeResourceTopology to show {cpus} available CPUs",
                    poll_s=0.02, describe=lambda: str(nrt(kube)))


def test_the_object_shows_this_machine_and_is_owned_by_its_node(lab: Lab, kube: Kube) -> None:
    ctx = EngineContext.build(discover("/"), read_config_file(lab.folder / "nri-numa" / "config.yaml"))
    expected = node_resource_topology(ctx, ctx.empty_allocations(), NODE_NAME)
    obj = wait_for(lambda: nrt(kube), 10.0, "the NodeResourceTopology object")
    assert obj["zones"] == expected["zones"]
    assert len(obj["zones"]) == len(ctx.topology.numa_nodes)
    attributes = {a["name"]: a["value"] for a in obj["attributes"]}
    assert attributes["topologyManagerPolicy"] == "single-numa-node"
    assert attributes["topologyManagerScope"] == "container"
    assert attributes["cpuManagerPolicy"] == "static"
    assert attributes["reservedSystemCPUs"] == "0"
    node = kube.node(NODE_NAME)
    assert node is not None
    # The owner is set once the Node exists (the agent starts before the kubelet registers it).
    owned = wait_for(lambda: (nrt(kube) or {}).get("metadata", {}).get("ownerReferences"),
                     NRT_RESYNC_S + 5.0, "the owner reference to the Node")
    assert [(o["kind"], o["name"], o["uid"]) for o in owned] == [
        ("Node", NODE_NAME, node["metadata"]["uid"])]


def test_available_cpus_follow_a_guaranteed_pod_within_a_second(lab: Lab, kube: Kube) -> None:
    assert available_cpus(wait_for(lambda: nrt(kube), 10.0, "the object")) == 1  # CPU 0 reserved
    kube.apply([pod_manifest("g-nrt", cpu="1", memory="64Mi")])
    shown = wait_available(kube, 0, 60.0)
    placed = agent_log_time(lab, "placed pod default/g-nrt")
    print(f"placement → object: {shown - placed:.3f} s")
    assert shown - placed <= FOLLOW_S
    wait_running(kube, ["g-nrt"])

    kube.delete_pod("g-nrt")
    shown = wait_available(kube, 1, 60.0)
    released = agent_log_time(lab, "released container work")
    print(f"release → object: {shown - released:.3f} s")
    assert 0 <= shown - released <= FOLLOW_S
    delete_and_wait_gone(kube, lab, ["g-nrt"])


def test_an_edit_by_someone_else_is_mended_at_the_next_check(lab: Lab, kube: Kube) -> None:
    obj = wait_for(lambda: nrt(kube), 10.0, "the object")
    honest = obj["zones"]
    obj["zones"] = [{**zone, "resources": [{**r, "available": "64"} for r in zone["resources"]]}
                    for zone in honest]
    kube.request("PUT", NRT_PATH, obj)
    edited = time.monotonic()
    wait_for(lambda: (nrt(kube) or {}).get("zones") == honest, NRT_RESYNC_S + 5.0,
             "the edited object mended")
    print(f"mended {time.monotonic() - edited:.1f} s after the edit (checks every {NRT_RESYNC_S} s)")
    assert "mended: it had been changed by someone else" in lab.agent_log.read_text(errors="replace")


def test_the_object_is_back_within_5_s_of_the_agent_starting(lab: Lab, kube: Kube) -> None:
    lab.stop("nri-numa")
    kube.request("DELETE", NRT_PATH)
    assert nrt(kube) is None
    started = time.monotonic()
    lab.restart("nri-numa")
    wait_for(lambda: nrt(kube), 5.0, "the NodeResourceTopology object after the agent started")
    print(f"object back {time.monotonic() - started:.2f} s after the agent started")
    # containerd takes the restarted plugin in before the next test creates pods.
    wait_for(lambda: lab.agent_log.read_text(errors="replace").count("synchronized:") >= 2, 30.0,
             "the restarted agent to synchronize")


def test_an_api_server_outage_never_slows_a_container_and_the_object_catches_up(
        lab: Lab, kube: Kube, layout: CgroupLayout) -> None:
    """Containers created through CRI while the API server is stopped for 30 s. The kubelet is
    stopped too: it would kill pods it does not know within a second."""
    client = lab.cri()
    sandboxes: list[str] = []

    def create(name: str, resources: Resources) -> float:
        pod = Pod(f"nrt-outage-{name}", (resources,))
        sandbox = client.run_pod(pod)
        sandboxes.append(sandbox)
        config = pod.container_config("work", IMAGE_REF)
        began = time.perf_counter()
        container = client.create_container(sandbox, config)
        took = time.perf_counter() - began
        client.start_container(container)
        return took

    def remove_pods() -> None:
        for sandbox in sandboxes:
            client.stop_pod(sandbox)
            client.remove_pod(sandbox)
        sandboxes.clear()

    lab.stop("kubelet")
    try:
        up = [create(f"up-{i}", Resources()) for i in range(3)]
        remove_pods()
        lab.stop("kube-apiserver", signal.SIGKILL)  # a crash; SIGTERM drains for a minute
        outage = time.monotonic()
        down = [create(f"down-{i}", Resources()) for i in range(3)]
        down.append(create("down-g", Resources(1000, 1000, 64 << 20, 64 << 20)))
        print(f"CreateContainer with the API server up: {[round(t, 3) for t in up]} s; "
              f"down: {[round(t, 3) for t in down]} s")
        assert statistics.median(down) <= statistics.median(up) + 0.1
        assert max(down) < 1.0
        time.sleep(max(0.0, 30.0 - (time.monotonic() - outage)))
        assert "NodeResourceTopology not written" in lab.agent_log.read_text(errors="replace")
        lab.restart("kube-apiserver")
        wait_for(kube.readyz, 60.0, "kube-apiserver ready again")
        back = time.monotonic()
        wait_available(kube, 0, 5.0)  # the Guaranteed container created in the outage holds CPU 1
        print(f"object right {time.monotonic() - back:.2f} s after the API server answered")
        remove_pods()
        wait_available(kube, 1, 5.0)
    finally:
        remove_pods()
        remove_cgroups(layout, client.cgroup_parents)
        client.close()
        lab.restart("kubelet")
    wait_for(lambda: kube.node_schedulable(NODE_NAME), 120.0, "the node Ready again")
