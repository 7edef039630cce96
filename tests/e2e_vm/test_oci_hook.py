"""The OCI hook on a real multi-NUMA kernel with runc's systemd cgroup driver on cgroup v2: bundles
made from hooks/runc-config.example.json (the Python client by path, createRuntime and poststop)
run with `runc --systemd-cgroup` in the guest (tests/e2e_vm/guest_hook.py). The containers'
`system.slice/nri-numa-hook-<run>-<name>.scope` cgroups and the containers themselves show whole cores
inside one node (memory is left alone: no Memory Manager in the hook's configuration); `nri-numa
state` reads the scopes back; poststop frees everything."""

from __future__ import annotations

import json

import pytest

from nri_numa.topology.cpulist import parse_list
from tests.e2e_vm import guest_plan
from tests.e2e_vm.conftest import Guest
from tests.e2e_vm.layout import Layout

pytestmark = pytest.mark.vm
GUEST_HOOK_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def hook_run(guest: Guest) -> dict:
    layout = guest.layout
    plan = {"config": guest_plan.base_config(layout),
            "containers": [{"name": "shared", "cpus": 0},
                           {"name": "whole-node", "cpus": len(guest_plan.whole_node(layout).cpus)},
                           {"name": "one-core", "cpus": guest_plan.threads(layout)}]}
    done = guest.run(["python3", "-m", "tests.e2e_vm.guest_hook"], stdin=json.dumps(plan),
                     timeout_s=GUEST_HOOK_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert "error" not in answer, answer["error"]
    return answer


def created(hook_run: dict, name: str) -> dict:
    got = hook_run["containers"][name]
    assert got["created"], f"{name}: {got['stderr']}"
    return got


def test_the_hook_pins_whole_cores_of_one_node_and_its_memory(hook_run: dict, vm_layout: Layout) -> None:
    cores = [set(group) for n in vm_layout.nodes for group in n.siblings]
    for name in ("whole-node", "one-core"):
        got = created(hook_run, name)
        assert got["cgroup"] == f"/system.slice/{hook_run['scope_prefix']}-{name}.scope"
        cpus = parse_list(got["cpus_effective"])
        assert cpus == parse_list(got["inside_cpus"]) == parse_list(hook_run["cpus_effective_at_end"][name])
        assert len({n.id for n in vm_layout.nodes if cpus & set(n.cpus)}) == 1, f"{name}: {cpus} spans nodes"
        assert all(core <= cpus or not core & cpus for core in cores), f"{name}: a core split in {cpus}"
        # CPUs only (no Memory Manager here): as the kubelet's CPU manager, the hook leaves memory alone.
        assert parse_list(got["mems_effective"]) == parse_list(got["inside_mems"]) == {n.id for n in vm_layout.nodes}
    whole = parse_list(created(hook_run, "whole-node")["cpus_effective"])
    assert any(whole == set(n.cpus) for n in vm_layout.nodes), whole


def test_the_shared_container_keeps_what_the_exclusive_ones_left(hook_run: dict, vm_layout: Layout) -> None:
    every_cpu = {cpu for n in vm_layout.nodes for cpu in n.cpus}
    exclusive = parse_list(created(hook_run, "whole-node")["cpus"]) | parse_list(created(hook_run, "one-core")["cpus"])
    assert parse_list(created(hook_run, "shared")["inside_cpus"]) == every_cpu
    assert parse_list(hook_run["cpus_effective_at_end"]["shared"]) == every_cpu - exclusive


def test_state_reads_the_hooks_scopes_and_poststop_frees_them(hook_run: dict) -> None:
    assert hook_run["state"]["status"] == 0, hook_run["state"]
    state = json.loads(hook_run["state"]["stdout"])
    assert state["drifted"] == 0
    assert {c["cgroup"]["path"] for c in state["containers"]} == \
        {got["cgroup"] for got in hook_run["containers"].values()}
    assert not hook_run.get("delete_errors")
    after = json.loads(hook_run["state_after_delete"]["stdout"]) if hook_run["state_after_delete"]["stdout"] else {}
    assert after.get("containers", []) == [], hook_run["state_after_delete"]
