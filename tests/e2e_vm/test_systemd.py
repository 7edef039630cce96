"""nri-numa's systemd units, started by a real systemd: packaging/nri-numa.service,
packaging/nri-numa-hook-daemon.service and .socket installed in the guest (PID 1 systemd, cgroup
v2) as docs/install.md says, then used (tests/e2e_vm/guest_systemd.py runs in the guest).

- The agent's unit is enabled before containerd runs (no /var/run/nri yet): it must start and
  wait for the socket, then place a Guaranteed pod of containerd.service; after `kill -9` of its
  main PID systemd starts it again and the new agent adopts the running container (its cpuset and
  the ledger unchanged) and places the next pod beside it.
- The hook daemon is not running until the first hook: that hook connects to the socket unit's
  socket, systemd starts the daemon with it, and the daemon serves it; the second hook is served
  by the same daemon. The bundles live in /tmp, where a runtime may keep them."""

from __future__ import annotations

import json

import pytest

from nri_numa.topology.cpulist import parse_list
from tests.e2e_vm import guest_plan
from tests.e2e_vm.conftest import _TIMES, Guest
from tests.e2e_vm.layout import Layout

pytestmark = pytest.mark.vm
GUEST_SYSTEMD_TIMEOUT_S = 600
RESERVED_MEMORY = "256Mi"  # what the test edits the example's 1Gi of node 0 to (nodes of 768 MiB)


@pytest.fixture(scope="module")
def systemd_run(guest: Guest) -> dict:
    layout = guest.layout
    plan = {"pod_cpu_m": guest_plan.threads(layout) * 1000, "reserved_memory": RESERVED_MEMORY,
            "hook_config": guest_plan.base_config(layout), "hook_cpus": guest_plan.threads(layout)}
    done = guest.run(["python3", "-m", "tests.e2e_vm.guest_systemd"], stdin=json.dumps(plan),
                     timeout_s=GUEST_SYSTEMD_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    (guest.vm / "guest-systemd.json").write_text(done.stdout)
    journal = "\n".join(answer.get("agent_journal", []))
    assert "error" not in answer, f"{answer['error']}\nthe agent's journal:\n{journal}"
    hook = answer["containers"]
    _TIMES.append(f"systemd: agent enabled to its first connect attempt {answer['install']['enable_to_first_attempt_s']} s, "
                  f"kill -9 to restarted {answer['restart_s']} s, to synchronized {answer['kill_to_synchronized_s']} s; "
                  f"hooks through the socket unit: first (starts the daemon) {hook['first']['run_s']} s, "
                  f"second {hook['second']['run_s']} s (runc run, guest seconds)")
    return answer


def one_node_whole_cores(layout: Layout, cpus: set[int]) -> bool:
    cores = [set(group) for n in layout.nodes for group in n.siblings]
    return (len({n.id for n in layout.nodes if cpus & set(n.cpus)}) == 1
            and all(core <= cpus or not core & cpus for core in cores))


def test_the_agent_unit_starts_before_containerd_and_places_a_pod(systemd_run: dict, vm_layout: Layout) -> None:
    install = systemd_run["install"]
    assert install["edited"] and not install["nri_dir_before"]
    # Started once and waiting for the NRI socket: not failing at start (226/NAMESPACE) and restarting.
    assert "first_attempt_error" not in install, "\n".join(systemd_run["agent_journal"])
    assert (install["active"], install["restarts"]) == ("active", 0), install
    pod = systemd_run["pod"]
    assert pod["created"], pod.get("error")
    cpus = parse_list(pod["cpus_effective"])
    assert len(cpus) == guest_plan.threads(vm_layout) and one_node_whole_cores(vm_layout, cpus), cpus
    assert parse_list(pod["inside_cpus"]) == cpus
    assert not cpus & {0, 1}, f"{cpus}: the example's reservedSystemCPUs given out"


def ledger(state: dict) -> tuple[str, list[tuple[str, str]]]:
    assert state["status"] == 0, state
    got = json.loads(state["stdout"])
    return got["shared_pool"], sorted((c["id"], json.dumps(c, sort_keys=True)) for c in got["containers"])


def test_systemd_restarts_the_killed_agent_which_adopts_the_running_container(systemd_run: dict,
                                                                             vm_layout: Layout) -> None:
    assert systemd_run["new_pid"] not in (0, systemd_run["killed_pid"])
    assert systemd_run["restarts"] == 1
    assert "synchronized: 1 containers managed" in systemd_run["synchronized_line"]
    assert systemd_run["pod_cpus_after_restart"] == systemd_run["pod"]["cpus_effective"]
    before, after = ledger(systemd_run["state_before"]), ledger(systemd_run["state_after"])
    assert [c for c, _ in before[1]] == [systemd_run["pod"]["container_id"]]
    assert after == before
    # The new agent knows those CPUs are taken: the next pod gets others.
    later = systemd_run["pod_after_restart"]
    assert later["created"], later.get("error")
    later_cpus = parse_list(later["cpus_effective"])
    assert one_node_whole_cores(vm_layout, later_cpus)
    assert not later_cpus & parse_list(systemd_run["pod"]["cpus_effective"])


def test_the_socket_unit_starts_the_hook_daemon_on_the_first_hook(systemd_run: dict, vm_layout: Layout) -> None:
    assert (systemd_run["socket_active"], systemd_run["socket_exists"]) == ("active", True)
    assert systemd_run["daemon_before"] == "inactive"
    first, second = systemd_run["containers"]["first"], systemd_run["containers"]["second"]
    assert first["created"], first["stderr"]
    assert second["created"], second["stderr"]
    assert first["daemon"] == second["daemon"] == "active"
    daemon = first["daemon_pid"]
    assert daemon and second["daemon_pid"] == daemon, "the second hook was not served by the first's daemon"
    log = "\n".join(systemd_run["hook_log"])
    assert f"hook daemon {daemon} listening on /run/nri-numa/hook.sock (socket handed over)" in log
    for name, got in (("first", first), ("second", second)):
        assert f"hook[{daemon}] createRuntime: placed container {name}: cpus {got['cpus']} (exclusive)" in log
        assert one_node_whole_cores(vm_layout, parse_list(got["cpus"]))
    assert not parse_list(first["cpus"]) & parse_list(second["cpus"])


def test_the_guest_is_left_as_it_was(systemd_run: dict) -> None:
    assert systemd_run["cleanup_problems"] == []
