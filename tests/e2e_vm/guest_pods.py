"""Runs in the numa-vm guest: pods through real containerd (SystemdCgroup = true, cgroup v2) and
`nri-numa run`, and what each container really got, as JSON on standard output.

    numa-vm exec DIR -- python3 -m tests.e2e_vm.guest_pods < plan.json

The plan (written by the tests on the host, tests/e2e_vm/guest_plan.py):
    {"containerd": "2.1.9",
     "scenarios": [{"name": "cpu", "config": {KubeletConfiguration keys},
                    "pods": [{"name": "g2", "cpu_m": 2000, "memory_mib": 64,
                              "command": ["sh", "-c", "..."],     (optional)
                              "hugepages_2m_mib": 0,               (optional)
                              "wait_anon_mib": 256,                (optional: wait until the
                                                                    container holds this much anon)
                              "mounts": [["/usr", "/host/usr"]],   (optional: read-only binds)
                              "env": {"PYTHONHOME": "/host/usr"},  (optional)
                              "wait_hugetlb_mib": 16}]}]}          (optional: wait until its
                                                                    hugetlb.2MB.current is this much;
                                                                    each node's free 2 MiB pages are
                                                                    read before and after)
Each scenario gets a fresh `nri-numa run` (its own state folder) on the one containerd, its pods
are run in order and all removed at its end. The answer, per scenario and pod: the container's
cgroup (from /proc/<pid>/cgroup), its cpuset files, Cpus/Mems_allowed_list inside it, its
memory.numa_stat, or the error CreateContainer gave; the agent's log; the seconds each step took.

It reuses the e2e harness (tests/e2e/harness) and the agent driver (tests/e2e/nri_agent.py): the
same containerd configs, CRI client, pod shapes and busybox image as the tier on the host."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import grpc

import tests.e2e.nri_agent as nri_agent
from tests.e2e.harness.cgroups import CgroupLayout, allowed_inside, detect_layout, process_cgroup, read_cpuset
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.cri import api_pb2 as cri
from tests.e2e.harness.cri import CriClient, Pod, Resources
from tests.e2e.harness.image import build_image, import_image
from tests.e2e.harness.runtimes import find_runtimes

MiB = 1 << 20
GUEST_AGENT = Path("/usr/local/bin/nri-numa")  # scripts/vm-deps: the checkout's nri_numa, on the src disk
WAIT_ANON_TIMEOUT_S = 120.0
DRIFT_REPAIR_TIMEOUT_S = 60.0
RECONCILE_WAIT_S = 2.0  # the churn scenario's cpuManagerReconcilePeriod
AGENT_ARGS = ("--pod-resources-socket", "", "--metrics-address", "off")


def log(message: str) -> None:
    print(f"guest_pods: {message}", file=sys.stderr, flush=True)


def numa_stat(layout: CgroupLayout, cgroup: str) -> dict[str, dict[int, int]]:
    """memory.numa_stat: {"anon": {node: bytes}, ...}."""
    stats: dict[str, dict[int, int]] = {}
    for line in (layout.mount / cgroup.lstrip("/") / "memory.numa_stat").read_text().splitlines():
        key, *per_node = line.split()
        stats[key] = {int(n.split("=")[0][1:]): int(n.split("=")[1]) for n in per_node}
    return stats


def wait_anon(layout: CgroupLayout, cgroup: str, at_least: int) -> dict[str, dict[int, int]]:
    deadline = time.monotonic() + WAIT_ANON_TIMEOUT_S
    while True:
        stats = numa_stat(layout, cgroup)
        if sum(stats.get("anon", {}).values()) >= at_least or time.monotonic() > deadline:
            return stats
        time.sleep(0.5)


def resources(spec: dict) -> Resources:
    memory = spec.get("memory_mib", 64) * MiB
    cpu = spec.get("cpu_m", 0)
    if spec.get("besteffort"):
        return Resources()
    return Resources(cpu_request_m=cpu, cpu_limit_m=cpu, memory_request=memory, memory_limit=memory)


def container_config(pod: Pod, spec: dict, image_ref: str):  # -> cri.ContainerConfig
    config = pod.container_config("work", image_ref, command=spec.get("command"))
    hugepages = spec.get("hugepages_2m_mib", 0)
    if hugepages:
        limit = config.linux.resources.hugepage_limits.add()
        limit.page_size, limit.limit = "2MB", hugepages * MiB
    for host_path, container_path in spec.get("mounts", []):
        config.mounts.add(host_path=host_path, container_path=container_path, readonly=True)
    for key, value in spec.get("env", {}).items():
        config.envs.add(key=key, value=value)
    return config


def free_hugepages() -> dict[int, int]:
    """free_hugepages of every node's 2 MiB pool."""
    nodes = Path("/sys/devices/system/node")
    return {int(node.name[4:]): int((node / "hugepages/hugepages-2048kB/free_hugepages").read_text())
            for node in sorted(nodes.glob("node[0-9]*"))}


def wait_hugetlb(layout: CgroupLayout, cgroup: str, at_least: int) -> int:
    """hugetlb.2MB.current of the cgroup once it holds at_least bytes (or at the deadline)."""
    current = layout.mount / cgroup.lstrip("/") / "hugetlb.2MB.current"
    deadline = time.monotonic() + WAIT_ANON_TIMEOUT_S
    while True:
        held = int(current.read_text())
        if held >= at_least or time.monotonic() > deadline:
            return held
        time.sleep(0.5)


def huge_pages_by_node(pid: int) -> dict[int, int]:
    """The huge pages of the process's mappings per node, from /proc/PID/numa_maps (N<node>=pages
    on the lines marked huge)."""
    pages: dict[int, int] = {}
    for line in Path(f"/proc/{pid}/numa_maps").read_text().splitlines():
        fields = line.split()
        if "huge" not in fields:
            continue
        for field in fields:
            if field.startswith("N") and "=" in field:
                node, count = field[1:].split("=")
                pages[int(node)] = pages.get(int(node), 0) + int(count)
    return pages


def run_pod(client: CriClient, layout: CgroupLayout, spec: dict, image_ref: str) -> dict:
    pod = Pod(spec["name"], (resources(spec),), cgroup_driver="systemd",
              annotations=tuple(spec.get("annotations", {}).items()))
    got: dict[str, object] = {"cgroup_parent": pod.cgroup_parent, "qos": pod.qos.value}
    if spec.get("wait_hugetlb_mib"):
        got["free_hugepages_before"] = free_hugepages()
    began = time.monotonic()
    sandbox = client.run_pod(pod)
    got["sandbox_id"] = sandbox
    try:
        container = client.create_container(sandbox, container_config(pod, spec, image_ref))
    except grpc.RpcError as exc:
        got.update(created=False, error=f"{exc.code().name}: {exc.details()}")
        return got
    got["create_s"] = round(time.monotonic() - began, 2)
    client.start_container(container)
    got["start_s"] = round(time.monotonic() - began, 2)
    info = client.container_info(container)
    cgroup = process_cgroup(int(info["pid"]), layout)  # type: ignore[arg-type]
    cpuset = read_cpuset(layout, cgroup)
    inside = allowed_inside(client, container)
    spec_linux = info["runtimeSpec"]["linux"]  # type: ignore[index]
    got["spec_hugepage_limits"] = spec_linux.get("resources", {}).get("hugepageLimits", [])
    got.update(created=True, container_id=container, cgroups_path=spec_linux["cgroupsPath"],
               cgroup=cgroup, cpus=cpuset.cpus, cpus_effective=cpuset.effective_cpus, mems=cpuset.mems,
               mems_effective=cpuset.effective_mems, inside_cpus=inside.cpus, inside_mems=inside.mems)
    if spec.get("wait_anon_mib"):
        got["numa_stat"] = wait_anon(layout, cgroup, spec["wait_anon_mib"] * MiB)
    hugetlb = layout.mount / cgroup.lstrip("/") / "hugetlb.2MB.max"
    if hugetlb.is_file():
        got["hugetlb_2mb_max"] = hugetlb.read_text().strip()
    if spec.get("wait_hugetlb_mib"):
        got["hugetlb_2mb_current"] = wait_hugetlb(layout, cgroup, spec["wait_hugetlb_mib"] * MiB)
        got["free_hugepages_after"] = free_hugepages()
        got["huge_pages_by_node"] = huge_pages_by_node(int(info["pid"]))  # type: ignore[arg-type]
    return got


def shared_pool_now(client: CriClient, layout: CgroupLayout, names: dict[str, str]) -> dict[str, str]:
    """cpuset.cpus.effective of every container again, after the last pod ran."""
    now = {}
    for name, container in names.items():
        pid = client.container_info(container)["pid"]
        now[name] = read_cpuset(layout, process_cgroup(int(pid), layout)).effective_cpus  # type: ignore[arg-type]
    return now


def container_cgroup(client: CriClient, layout: CgroupLayout, container: str) -> Path:
    return layout.mount / process_cgroup(int(client.container_info(container)["pid"]), layout).lstrip("/")  # type: ignore[arg-type]


def widen_and_wait(client: CriClient, layout: CgroupLayout, container: str) -> dict[str, object]:
    """Writes every CPU into the container's cpuset.cpus behind the agent's back (as another
    agent or a `runc update` would), then waits for the agent's periodic check to put its
    cpuset back. The seconds that took, or the cpuset still there at the deadline."""
    folder = container_cgroup(client, layout, container)
    before = (folder / "cpuset.cpus").read_text().strip()
    every_cpu = Path("/sys/devices/system/cpu/online").read_text().strip()
    (folder / "cpuset.cpus").write_text(every_cpu + "\n")
    widened = (folder / "cpuset.cpus.effective").read_text().strip()
    began = time.monotonic()
    while time.monotonic() - began < DRIFT_REPAIR_TIMEOUT_S:
        now = (folder / "cpuset.cpus").read_text().strip()
        if now == before:
            return {"before": before, "widened": widened, "repaired_after_s": round(time.monotonic() - began, 2),
                    "effective": (folder / "cpuset.cpus.effective").read_text().strip()}
        time.sleep(0.2)
    return {"before": before, "widened": widened, "repaired_after_s": None,
            "still": (folder / "cpuset.cpus").read_text().strip()}


def restart_agent(daemon: ContainerdDaemon, agent: nri_agent.Agent, client: CriClient, layout: CgroupLayout,
                  live: dict[str, str]) -> dict[str, object]:
    """kill -9 of the agent, a new one on the same state folder; what every container has then."""
    before = shared_pool_now(client, layout, live)
    agent.kill()
    began = time.monotonic()
    connected = nri_agent.start_and_connect(daemon, agent, timeout_s=60)
    agent.wait_log("synchronized:", count=2, timeout_s=60)
    return {"connect_s": round(connected, 2), "synchronized_s": round(time.monotonic() - began, 2),
            "cpus_effective_before": before, "cpus_effective": shared_pool_now(client, layout, live)}


def churn_and_restart(daemon: ContainerdDaemon, agent: nri_agent.Agent, client: CriClient,
                      layout: CgroupLayout, image_ref: str, churn: dict, live: dict[str, str]) -> dict[str, object]:
    """Pods created and removed in a loop (a thread; the oldest of its pods is removed before
    the next is created when churn["keep"] are alive) while the agent is killed with SIGKILL, one more pod is created with no agent,
    containerd is restarted, a new agent is started on the same state, and containerd is
    restarted once more under that agent. The churn's surviving pods join ``live``. What
    happened, with guest seconds; failed CRI calls are expected while containerd is down."""
    began = time.monotonic()
    events: list[list[object]] = []
    stop = threading.Event()

    def note(what: str) -> None:
        events.append([round(time.monotonic() - began, 2), what])

    def churn_loop() -> None:
        running: list[tuple[str, str]] = []  # (name, sandbox id), oldest first
        failed: set[str] = set()  # pods whose run_pod failed part-way: removed as the kubelet would
        for i in range(1, churn["max_pods"] + 1):
            if stop.is_set():
                break
            failed -= collect(client, failed, note)
            while len(running) >= churn["keep"]:
                name, sandbox = running.pop(0)
                live.pop(name, None)
                remove_quietly(client, sandbox, note)
                note(f"{name} removed")
            spec = {"name": f"churn-{i}", "cpu_m": churn["cpu_m"]}
            try:
                got = run_pod(client, layout, spec, image_ref)
            except Exception as exc:  # noqa: BLE001 - containerd may be restarting
                note(f"churn-{i}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                failed.add(f"churn-{i}")
                time.sleep(churn["pause_s"])
                continue
            if got["created"]:
                note(f"churn-{i} created: {got['cpus_effective']}")
                running.append((spec["name"], str(got["sandbox_id"])))
                live[spec["name"]] = str(got["container_id"])
            else:
                note(f"churn-{i} refused: {got['error']}")
                remove_quietly(client, str(got["sandbox_id"]), note)
            time.sleep(churn["pause_s"])
        deadline = time.monotonic() + churn["join_timeout_s"] / 2
        while failed and time.monotonic() < deadline:
            failed -= collect(client, failed, note)
        note(f"churn stopped{', not removed: ' + ', '.join(sorted(failed)) if failed else ''}")

    worker = threading.Thread(target=churn_loop, name="churn", daemon=True)
    worker.start()
    restarts: dict[str, object] = {}
    time.sleep(churn["before_kill_s"])
    agent.kill()
    note("agent killed (SIGKILL)")
    try:
        got = run_pod(client, layout, {"name": "while-agent-down", "cpu_m": churn["cpu_m"]}, image_ref)
        note(f"while-agent-down created={got['created']}: {got.get('cpus_effective', got.get('error'))}")
        if got["created"]:
            live["while-agent-down"] = str(got["container_id"])
    except Exception as exc:  # noqa: BLE001
        note(f"while-agent-down: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    restarts["containerd_restart_s"] = round(daemon.stop() + daemon.start(timeout_s=180), 2)
    note("containerd restarted")
    synchronized = agent.log_count("synchronized:")
    restarts["agent_connect_s"] = round(nri_agent.start_and_connect(daemon, agent, timeout_s=120), 2)
    agent.wait_log("synchronized:", count=synchronized + 1, timeout_s=120)
    note("new agent connected and synchronized")
    time.sleep(churn["after_restart_s"])
    synchronized = agent.log_count("synchronized:")
    connected = nri_agent.connected_count(daemon, agent)
    restarts["second_containerd_restart_s"] = round(daemon.stop() + daemon.start(timeout_s=180), 2)
    note("containerd restarted under the running agent")
    wait = time.monotonic()
    nri_agent.wait_until(lambda: nri_agent.connected_count(daemon, agent) > connected, 120,
                         "the agent to reconnect to the restarted containerd", poll_s=0.2)
    agent.wait_log("synchronized:", count=synchronized + 1, timeout_s=120)
    restarts["agent_reconnect_s"] = round(time.monotonic() - wait, 2)
    note("agent reconnected and synchronized")
    time.sleep(churn["after_restart_s"])
    stop.set()
    worker.join(churn["join_timeout_s"])
    restarts["churn_stopped"] = not worker.is_alive()
    # One periodic check after the churn, so the ledger has seen the last changes.
    time.sleep(2 * RECONCILE_WAIT_S)
    return {"events": events, **restarts}


def collect(client: CriClient, names: set[str], note) -> set[str]:  # noqa: ANN001
    """Removes every sandbox of the pods named (a RunPodSandbox or CreateContainer that failed
    while containerd went down may still have made one); the names done."""
    if not names:
        return set()
    try:
        sandboxes = [(s.metadata.name, s.id) for s in client.list_pods() if s.metadata.name in names]
        for name, sandbox in sandboxes:
            client.stop_pod(sandbox)
            client.remove_pod(sandbox)
            note(f"{name} removed after its failure (sandbox {sandbox[:12]})")
    except Exception as exc:  # noqa: BLE001 - tried again on the next round
        note(f"collecting {sorted(names)}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        return set()
    return set(names)


def remove_quietly(client: CriClient, sandbox: str, note) -> None:  # noqa: ANN001
    try:
        client.stop_pod(sandbox)
        client.remove_pod(sandbox)
    except Exception as exc:  # noqa: BLE001 - removed at the scenario's end instead
        note(f"removing {sandbox[:12]}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


def live_containers(client: CriClient, layout: CgroupLayout) -> dict[str, dict[str, str]]:
    """Every container containerd knows that is created or running, with its cgroup and
    cpuset files."""
    found = {}
    for container in client.list_containers():
        if container.state not in (cri.CONTAINER_CREATED, cri.CONTAINER_RUNNING):
            continue
        cgroup = process_cgroup(int(client.container_info(container.id)["pid"]), layout)  # type: ignore[arg-type]
        cpuset = read_cpuset(layout, cgroup)
        found[container.id] = {"state": cri.ContainerState.Name(container.state), "cgroup": cgroup, "cpus": cpuset.cpus, "cpus_effective": cpuset.effective_cpus,
                               "sandbox_id": container.pod_sandbox_id}
    return found


def run_scenario(daemon: ContainerdDaemon, layout: CgroupLayout, image_ref: str, scenario: dict,
                 folder: Path) -> dict:
    result: dict[str, object] = {"pods": {}}
    agent = nri_agent.Agent(daemon.paths.nri_socket, folder, extra_args=AGENT_ARGS)
    agent.config_file.write_text(json.dumps(scenario["config"]) + "\n")
    client = daemon.cri()
    try:
        result["connect_s"] = round(nri_agent.start_and_connect(daemon, agent, timeout_s=60), 2)
        for spec in scenario["pods"]:
            result["pods"][spec["name"]] = run_pod(client, layout, spec, image_ref)  # type: ignore[index]
        live = {name: got["container_id"] for name, got in result["pods"].items()  # type: ignore[union-attr]
                if got.get("created")}
        if scenario.get("drift"):
            result["drift"] = {name: widen_and_wait(client, layout, live[name]) for name in scenario["drift"]}
        if scenario.get("restart"):
            result["restart"] = restart_agent(daemon, agent, client, layout, live)
            for spec in scenario.get("pods_after_restart", []):
                result["pods"][spec["name"]] = run_pod(client, layout, spec, image_ref)  # type: ignore[index]
                if result["pods"][spec["name"]].get("created"):  # type: ignore[index]
                    live[spec["name"]] = result["pods"][spec["name"]]["container_id"]  # type: ignore[index]
        if scenario.get("churn"):
            result["churn"] = churn_and_restart(daemon, agent, client, layout, image_ref, scenario["churn"], live)
            result["live_containers"] = live_containers(client, layout)
        result["cpus_effective_at_end"] = shared_pool_now(client, layout, live)
        state = subprocess.run([str(GUEST_AGENT), "state", "--state-dir", str(agent.state_dir), "--json"],
                               capture_output=True, text=True, timeout=60, check=False)
        result["state"] = {"status": state.returncode, "stdout": state.stdout, "stderr": state.stderr[-2000:]}
    except Exception:  # noqa: BLE001 - the host test shows it with the agent's log
        result["error"] = traceback.format_exc()
    finally:
        errors = client.remove_all()
        client.close()
        agent.stop()
        # The pods' slices: the kubelet would remove them; systemd stops the whole tree.
        subprocess.run(["systemctl", "stop", "kubepods.slice"], capture_output=True, timeout=60, check=False)
        result["cleanup_errors"] = errors
        result["agent_log"] = agent.log_text()[-20000:]
        result["agent_alive_at_end"] = agent.alive()
    return result


def main() -> int:
    plan = json.load(sys.stdin)
    nri_agent.AGENT = GUEST_AGENT
    runtimes = find_runtimes()
    layout = detect_layout()
    base = Path(tempfile.mkdtemp(prefix="vm-e2e-", dir="/tmp"))
    answer: dict[str, object] = {"containerd": plan["containerd"], "scenarios": {}}
    image = build_image(runtimes.busybox, base)
    daemon = ContainerdDaemon(runtimes.containerd[plan["containerd"]], base / "containerd", image.ref,
                              log=base / "containerd.log", systemd_cgroup=True, hugetlb=True)
    try:
        answer["containerd_start_s"] = round(daemon.start(timeout_s=120), 2)
        import_image(daemon.binaries.ctr, daemon.address, image, timeout_s=120)
        for scenario in plan["scenarios"]:
            began = time.monotonic()
            folder = base / f"agent-{scenario['name']}"
            folder.mkdir()
            log(f"scenario {scenario['name']} on containerd {plan['containerd']}")
            got = run_scenario(daemon, layout, image.ref, scenario, folder)
            got["seconds"] = round(time.monotonic() - began, 1)
            answer["scenarios"][scenario["name"]] = got  # type: ignore[index]
    except Exception:  # noqa: BLE001
        answer["error"] = traceback.format_exc()
    finally:
        answer["containerd_log_tail"] = daemon.log_tail(60)
        answer["cleanup_problems"] = daemon.cleanup()
        shutil.rmtree(base, ignore_errors=True)
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
