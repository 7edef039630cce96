"""Today's behaviour, documented (the next work changes it): the scheduler knows nothing of
exclusive CPUs, so a second Guaranteed 1-CPU pod lands on this 2-CPU node (CPU 0 reserved, CPU 1
taken); nri-numa refuses its container at CreateContainer, and the kubelet shows nri-numa's
reason in the container status (waiting, CreateContainerError) and retries with back-off."""

from __future__ import annotations

import pytest

from tests.e2e.harness.cgroups import CgroupLayout
from tests.e2e_k8s.kube import Kube, container_statuses, wait_for
from tests.e2e_k8s.lab import Lab
from tests.e2e_k8s.pods import container_cpus, delete_and_wait_gone, describe_pods, pod_manifest, wait_running

pytestmark = pytest.mark.k8s
REASON = ("nri-numa: TopologyAffinityError: container work: Resources cannot be allocated with "
          "Topology locality (topology policy single-numa-node); cpu: asked 1 exclusive CPUs; "
          "free node 0: 0 CPUs")


def test_a_second_guaranteed_pod_is_refused_with_nri_numas_reason(
        lab: Lab, kube: Kube, layout: CgroupLayout) -> None:
    kube.apply([pod_manifest("g-first", cpu="1", memory="64Mi")])
    ids = wait_running(kube, ["g-first"])
    assert container_cpus(lab, layout, ids["g-first"]) == frozenset({1})

    kube.apply([pod_manifest("g-second", cpu="1", memory="64Mi")])

    def waiting() -> dict[str, str] | None:
        statuses = container_statuses(kube.pod("g-second"))
        state = statuses[0].get("state", {}).get("waiting") if statuses else None
        return state if state and state.get("reason") == "CreateContainerError" else None
    state = wait_for(waiting, 60.0, "g-second waiting with CreateContainerError",
                     describe=lambda: describe_pods(kube, ["g-second"]))
    print(f"g-second: {state}")
    assert REASON in state.get("message", ""), state
    pod = kube.pod("g-second")
    assert pod is not None and pod["spec"]["nodeName"] and pod["status"]["phase"] == "Pending"
    assert "refused pod default/g-second container work" in lab.agent_log.read_text(errors="replace")
    # The first pod keeps its CPU.
    assert container_cpus(lab, layout, ids["g-first"]) == frozenset({1})
    delete_and_wait_gone(kube, lab, ["g-first", "g-second"])
