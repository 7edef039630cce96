"""Runs in the numa-vm guest: nri-numa's systemd units (packaging/) installed and started by the
guest's own systemd (PID 1, cgroup v2) as docs/install.md tells a user to; what happened, as
JSON on standard output.

    numa-vm exec DIR -- python3 -m tests.e2e_vm.guest_systemd < plan.json

The plan: {"pod_cpu_m": 2000, "reserved_memory": "256Mi" (what the example's reserved memory of
node 0 is edited to), "hook_config": {KubeletConfiguration keys}, "hook_cpus": 2}.

1. The agent: /opt/nri-numa/venv/bin/nri-numa (the unit's ExecStart; here a link to the guest's
   nri-numa, which runs the checkout), packaging/nri-numa.conf.example as /etc/nri-numa/config.yaml,
   packaging/nri-numa.service, `systemctl daemon-reload`, `systemctl enable --now nri-numa`,
   before containerd exists (no /var/run/nri yet: the agent must wait for it, not fail). Then
   containerd 2.1.9 as containerd.service (a unit file as its package installs one, NRI on its
   default socket /var/run/nri/nri.sock, runc's systemd driver), a Guaranteed pod through CRI, `kill -9` of
   the unit's main PID, and what systemd and the new agent did: the pod's cpuset, the ledger
   (`nri-numa state`) before and after, and one more pod placed by the new agent.
2. The hook daemon: packaging/nri-numa-hook-daemon.{socket,service}, `systemctl enable --now
   nri-numa-hook-daemon.socket`; the daemon must not run before the first hook. Two runc
   bundles (in /tmp, where a runtime may keep them) whose createRuntime hook is the Python client
   with --state-dir /run/nri-numa: the first starts the daemon through the socket, the second is
   served by the same daemon.
Everything is removed at the end (units, containerd, pods, state), so the tier's other tests
find the guest as it was."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from tests.e2e.harness.cgroups import detect_layout, process_cgroup, read_cpuset
from tests.e2e.harness.containerd import ContainerdDaemon, to_toml
from tests.e2e.harness.cri import CriClient
from tests.e2e.harness.image import build_image, import_image
from tests.e2e.harness.runtimes import find_runtimes
from tests.e2e_vm import guest_hook
from tests.e2e_vm.guest_pods import run_pod

SRC = Path(__file__).resolve().parents[2]
PACKAGING = SRC / "packaging"
UNIT_DIR = Path("/etc/systemd/system")
UNITS = ("nri-numa.service", "nri-numa-hook-daemon.service", "nri-numa-hook-daemon.socket")
VENV_AGENT = Path("/opt/nri-numa/venv/bin/nri-numa")  # where the units' ExecStart looks
CONFIG_DIR = Path("/etc/nri-numa")
STATE_DIR = Path("/var/lib/nri-numa")  # nri-numa.service's --state-dir (StateDirectory=)
HOOK_STATE_DIR = Path("/run/nri-numa")  # nri-numa-hook-daemon.service's --state-dir
HOOK_CONFIG = CONFIG_DIR / "config.json"
NRI_SOCKET_DIR = Path("/var/run/nri")
CONTAINERD_UNIT = UNIT_DIR / "containerd.service"
WAIT_S = 90.0
EXAMPLE_RESERVED = "memory: 1Gi"


def sh(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    done = sh("systemctl", *args)
    if done.returncode != 0:
        raise RuntimeError(f"systemctl {' '.join(args)}: {done.returncode} {done.stderr.strip()}")
    return done


def show(unit: str, prop: str) -> str:
    return sh("systemctl", "show", "-p", prop, "--value", unit).stdout.strip()


JOURNAL_SINCE: list[str] = []  # the journal's cursor when this run began


def journal(unit: str) -> list[str]:
    """The unit's lines since this run began."""
    since = [f"--after-cursor={JOURNAL_SINCE[0]}"] if JOURNAL_SINCE else []
    return sh("journalctl", "-u", unit, "-o", "cat", "--no-pager", *since).stdout.splitlines()


def mark_journal() -> None:
    cursor = sh("journalctl", "-n", "0", "--show-cursor", "--no-pager").stdout.strip().rpartition("cursor: ")[2]
    JOURNAL_SINCE[:] = [cursor] if cursor else []


def wait_until(check: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(f"waited {timeout_s:g} s for {what}")
        time.sleep(0.1)
    return round(time.monotonic() - began, 2)


def count(unit: str, needle: str) -> int:
    return sum(needle in line for line in journal(unit))


def state() -> dict[str, object]:
    done = sh(str(VENV_AGENT), "state", "--state-dir", str(STATE_DIR), "--json")
    return {"status": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-2000:]}


def install_agent(plan_reserved: str) -> dict[str, object]:
    """As docs/install.md: the package where the unit expects it, the example configuration, the
    unit; enabled and started while no containerd (and no /var/run/nri) exists yet."""
    VENV_AGENT.parent.mkdir(parents=True, exist_ok=True)
    VENV_AGENT.unlink(missing_ok=True)
    VENV_AGENT.symlink_to(shutil.which("nri-numa") or "/usr/local/bin/nri-numa")
    CONFIG_DIR.mkdir(exist_ok=True)
    # "then edit it": the example reserves 1 GiB of node 0 for the system, more than a node of
    # the small layouts holds (the agent refuses that); the rest is used as shipped.
    example = (PACKAGING / "nri-numa.conf.example").read_text()
    (CONFIG_DIR / "config.yaml").write_text(example.replace(EXAMPLE_RESERVED, f"memory: {plan_reserved}"))
    got: dict[str, object] = {"edited": EXAMPLE_RESERVED in example}
    shutil.copy(PACKAGING / "nri-numa.service", UNIT_DIR)
    got["nri_dir_before"] = NRI_SOCKET_DIR.exists()
    systemctl("daemon-reload")
    began = time.monotonic()
    systemctl("enable", "--now", "nri-numa")
    try:
        got["first_attempt_s"] = wait_until(lambda: count("nri-numa", "connecting to") > 0,
                                            "the agent's first attempt to connect", 60)
    except TimeoutError as exc:
        got["first_attempt_error"] = str(exc)
    got["enable_to_first_attempt_s"] = round(time.monotonic() - began, 2)
    got.update(active=show("nri-numa", "ActiveState"), restarts=int(show("nri-numa", "NRestarts") or 0),
               result=show("nri-numa", "Result"))
    return got


def start_containerd(runtimes, base: Path) -> tuple[ContainerdDaemon, float]:  # noqa: ANN001
    """containerd as containerd.service, the unit the agent's unit orders itself after, installed as
    its package installs it (Type=notify, KillMode=process: the shims outlive a restart), with
    NRI on the default socket the agent's unit names."""
    image = build_image(runtimes.busybox, base)
    daemon = ContainerdDaemon(runtimes.containerd["2.1.9"], base / "containerd", image.ref,
                              log=base / "containerd.log", systemd_cgroup=True)
    config = daemon.config()
    config["plugins"]["io.containerd.nri.v1.nri"]["socket_path"] = str(NRI_SOCKET_DIR / "nri.sock")  # type: ignore[index]
    for folder in (daemon.paths.nri_plugins, daemon.paths.nri_plugin_config, daemon.paths.cni / "bin",
                   daemon.paths.cni / "net.d"):
        folder.mkdir(parents=True, exist_ok=True)
    daemon.paths.config.write_text(to_toml(config))
    CONTAINERD_UNIT.write_text(f"""[Unit]
Description=containerd {daemon.version} (the vm tier's)
After=local-fs.target

[Service]
Type=notify
Environment=PATH={daemon.binaries.bindir}:/usr/sbin:/usr/bin:/sbin:/bin
ExecStart={daemon.binaries.containerd} --config {daemon.paths.config}
KillMode=process
Delegate=yes
""")
    systemctl("daemon-reload")
    began = time.monotonic()
    systemctl("start", CONTAINERD_UNIT.name)
    started = time.monotonic() - began
    import_image(daemon.binaries.ctr, daemon.address, image, timeout_s=120)
    return daemon, round(started, 2)


def pod_cpus(client: CriClient, layout, container: str) -> str:  # noqa: ANN001
    return read_cpuset(layout, process_cgroup(int(client.container_info(container)["pid"]), layout)).effective_cpus  # type: ignore[arg-type]


def agent_part(plan: dict, runtimes, base: Path, answer: dict) -> None:  # noqa: ANN001
    answer["install"] = install_agent(plan["reserved_memory"])
    daemon, answer["containerd_start_s"] = start_containerd(runtimes, base)
    answer["containerd_daemon"] = daemon
    answer["connect_s"] = wait_until(lambda: count("nri-numa", "synchronized:") > 0,
                                     "the agent to connect to containerd and synchronize")
    layout = detect_layout()
    client = daemon.cri()
    answer["client"] = client
    first = run_pod(client, layout, {"name": "placed", "cpu_m": plan["pod_cpu_m"]}, daemon.sandbox_image)
    answer["pod"] = first
    if not first.get("created"):
        return
    answer["state_before"] = state()
    old_pid = int(show("nri-numa", "MainPID"))
    synchronized = count("nri-numa", "synchronized:")
    os.kill(old_pid, signal.SIGKILL)
    began = time.monotonic()
    answer["killed_pid"] = old_pid
    answer["restart_s"] = wait_until(lambda: show("nri-numa", "MainPID") not in ("0", str(old_pid)),
                                     "systemd to start the agent again")
    answer["new_pid"] = int(show("nri-numa", "MainPID"))
    wait_until(lambda: count("nri-numa", "synchronized:") > synchronized, "the new agent to synchronize")
    answer["kill_to_synchronized_s"] = round(time.monotonic() - began, 2)
    answer["synchronized_line"] = [line for line in journal("nri-numa") if "synchronized:" in line][-1]
    answer["restarts"] = int(show("nri-numa", "NRestarts") or 0)
    answer["pod_cpus_after_restart"] = pod_cpus(client, layout, str(first["container_id"]))
    answer["state_after"] = state()
    answer["pod_after_restart"] = run_pod(client, layout, {"name": "after", "cpu_m": plan["pod_cpu_m"]},
                                          daemon.sandbox_image)


def hook_log_lines() -> list[str]:
    log = HOOK_STATE_DIR / "hook.log"
    return log.read_text(errors="replace").splitlines() if log.exists() else []


def hook_part(plan: dict, runtimes, base: Path, answer: dict) -> None:  # noqa: ANN001
    HOOK_CONFIG.write_text(json.dumps(plan["hook_config"]) + "\n")
    for unit in ("nri-numa-hook-daemon.service", "nri-numa-hook-daemon.socket"):
        shutil.copy(PACKAGING / unit, UNIT_DIR)
    systemctl("daemon-reload")
    systemctl("enable", "--now", "nri-numa-hook-daemon.socket")
    answer["socket_active"] = show("nri-numa-hook-daemon.socket", "ActiveState")
    answer["socket_exists"] = (HOOK_STATE_DIR / "hook.sock").is_socket()
    answer["daemon_before"] = show("nri-numa-hook-daemon.service", "ActiveState")
    rootfs = base / "rootfs"
    guest_hook.unpack_busybox(rootfs, runtimes.busybox)
    root = base / "runc"
    answer["containers"] = {}
    for name in ("first", "second"):
        bundle = guest_hook.write_bundle(base, rootfs, name, plan["hook_cpus"], HOOK_CONFIG, HOOK_STATE_DIR,
                                         "nri-numa-systemd")
        began = time.monotonic()
        started = guest_hook.run_detached(root, bundle, name)
        got: dict[str, object] = {"created": started.returncode == 0, "run_s": round(time.monotonic() - began, 2),
                                  "stderr": started.stderr[-2000:],
                                  "daemon": show("nri-numa-hook-daemon.service", "ActiveState"),
                                  "daemon_pid": int(show("nri-numa-hook-daemon.service", "MainPID") or 0)}
        answer["containers"][name] = got
        if started.returncode == 0:
            answer.setdefault("hook_containers", []).append(name)
            pid = json.loads(guest_hook.runc(root, "state", name).stdout)["pid"]
            got["cgroup"] = process_cgroup(pid, detect_layout())
            got["cpus"] = read_cpuset(detect_layout(), str(got["cgroup"])).effective_cpus
    answer["hook_log"] = hook_log_lines()[-20:]
    for name in answer.get("hook_containers", []):
        guest_hook.runc(root, "delete", "--force", name)


def cleanup(answer: dict, base: Path) -> list[str]:
    problems = []
    client = answer.pop("client", None)
    if client is not None:
        problems += client.remove_all()
        client.close()
    sh("systemctl", "disable", "--now", "nri-numa", "nri-numa-hook-daemon.socket", "nri-numa-hook-daemon")
    sh("systemctl", "stop", CONTAINERD_UNIT.name, "kubepods.slice")
    sh("systemctl", "reset-failed")
    daemon = answer.pop("containerd_daemon", None)
    if daemon is not None:
        problems += daemon.cleanup()
    for unit in UNITS:
        (UNIT_DIR / unit).unlink(missing_ok=True)
    CONTAINERD_UNIT.unlink(missing_ok=True)
    sh("systemctl", "daemon-reload")
    for path in (STATE_DIR, HOOK_STATE_DIR, CONFIG_DIR, VENV_AGENT.parents[1], NRI_SOCKET_DIR, base):
        shutil.rmtree(path, ignore_errors=True)
    return problems


def main() -> int:
    plan = json.load(sys.stdin)
    runtimes = find_runtimes()
    base = Path(tempfile.mkdtemp(prefix="vm-systemd-", dir="/tmp"))
    answer: dict[str, object] = {}
    cleanup({}, base)  # what an interrupted run may have left
    base.mkdir()
    mark_journal()
    try:
        agent_part(plan, runtimes, base, answer)
        hook_part(plan, runtimes, base, answer)
    except Exception:  # noqa: BLE001 - the host test shows it with the journal
        answer["error"] = traceback.format_exc()
    finally:
        answer["agent_journal"] = journal("nri-numa")[-40:]
        answer["cleanup_problems"] = cleanup(answer, base)
    json.dump(answer, sys.stdout, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
