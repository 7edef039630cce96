"""Runs in the numa-vm guest: the Kubernetes lab's node (kubelet 1.20.2, containerd 1.7.24 with
runc's systemd cgroup driver, `nri-numa run`) whose control plane runs on the host
(tests/e2e_vm/k8s_node.py). Each runs as a transient systemd unit of the guest, so it outlives
the ssh command that started it.

    numa-vm exec DIR -- python3 -m tests.e2e_vm.guest_node up < plan.json     (JSON answer)
    numa-vm exec DIR -- python3 -m tests.e2e_vm.guest_node down

The plan: {"kubelet": path of the kubelet binary in the guest, "kubeconfig": its text (the
apiserver as the guest reaches it, through ssh's reverse forward on the guest's 127.0.0.1),
"node": the node's name, "agent_config": KubeletConfiguration keys for nri-numa, "kubelet_port":
a port}. The pods are hostNetwork ones: the guest has no CNI plugin, and the node runs without a
pod network (its NetworkReady condition stays false; the kubelet still runs host-network pods)."""

from __future__ import annotations

import json
import shutil
import sys
import time
import traceback
from pathlib import Path

from tests.e2e.harness.containerd import ContainerdDaemon, _unmount_under, to_toml
from tests.e2e.harness.image import build_image, import_image
from tests.e2e.harness.runtimes import find_runtimes
from tests.e2e_vm.guest_systemd import sh, wait_until

BASE = Path("/var/lib/nri-numa-node")  # everything of the node; removed by `down`
CONTAINERD_VERSION = "1.7.24"  # kubelet 1.20 speaks CRI v1alpha2, which containerd 2.x dropped
UNITS = ("nri-numa-node-kubelet", "nri-numa-node-agent", "nri-numa-node-containerd")  # stop order
AGENT = "/usr/local/bin/nri-numa"
AGENT_METRICS = "127.0.0.1:9109"  # the agent's Prometheus metrics, on the guest's loopback
KUBELET_READY_S = 240.0


def run_unit(name: str, argv: list[str], *properties: str) -> None:
    done = sh("systemd-run", f"--unit={name}", "--collect", *(f"--property={p}" for p in properties), *argv)
    if done.returncode != 0:
        raise RuntimeError(f"systemd-run {name}: {done.stderr.strip()}")


def journal(unit: str, lines: int = 40) -> str:
    """The unit's lines since its last start (a unit of an earlier run has the same name)."""
    invocation = sh("systemctl", "show", "-p", "InvocationID", "--value", unit).stdout.strip()
    which = [f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else ["-u", unit]
    return sh("journalctl", *which, "-o", "cat", "--no-pager", "-n", str(lines)).stdout


def daemon(runtimes, image_ref: str) -> ContainerdDaemon:  # noqa: ANN001
    return ContainerdDaemon(runtimes.containerd[CONTAINERD_VERSION], BASE / "containerd", image_ref,
                            log=BASE / "containerd.log", systemd_cgroup=True)


def up(plan: dict) -> dict:
    answer: dict[str, object] = {}
    runtimes = find_runtimes()
    BASE.mkdir(parents=True)
    image = build_image(runtimes.busybox, BASE)
    containerd = daemon(runtimes, image.ref)
    for folder in (containerd.paths.nri_plugins, containerd.paths.nri_plugin_config,
                   containerd.paths.cni / "bin", containerd.paths.cni / "net.d"):
        folder.mkdir(parents=True, exist_ok=True)
    containerd.paths.config.write_text(to_toml(containerd.config()))
    began = time.monotonic()
    run_unit(UNITS[2], [str(containerd.binaries.containerd), "--config", str(containerd.paths.config)],
             "Type=notify", f"Environment=PATH={containerd.binaries.bindir}:/usr/sbin:/usr/bin:/sbin:/bin",
             "KillMode=mixed", "Delegate=yes")
    answer["containerd_s"] = round(time.monotonic() - began, 2)
    import_image(containerd.binaries.ctr, containerd.address, image, timeout_s=120)

    kubelet_root = BASE / "kubelet"
    kubeconfig = BASE / "kubeconfig"
    kubeconfig.write_text(plan["kubeconfig"])
    kubeconfig.chmod(0o600)
    agent_config = BASE / "agent.yaml"
    agent_config.write_text(json.dumps(plan["agent_config"]) + "\n")
    began = time.monotonic()
    run_unit(UNITS[1], [AGENT, "run", "--nri-socket", str(containerd.paths.nri_socket),
                        "--config", str(agent_config), "--state-dir", str(BASE / "agent-state"),
                        "--pod-resources-socket", str(kubelet_root / "pod-resources" / "kubelet.sock"),
                        "--metrics-address", AGENT_METRICS, "--kubeconfig", str(kubeconfig),
                        "--node-name", plan["node"], "--nrt-resync-period", "5"])
    answer["agent_connect_s"] = wait_until(lambda: "synchronized:" in journal(UNITS[1]),
                                     "nri-numa to connect to containerd", 120)
    answer["agent_s"] = round(time.monotonic() - began, 2)

    config = BASE / "kubelet.yaml"
    config.write_text(json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": "127.0.0.1", "port": plan["kubelet_port"], "readOnlyPort": 0, "healthzPort": 0,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        # cgroup v2, the systemd driver: pods in kubepods.slice, as on a production node.
        "cgroupDriver": "systemd",
        "cpuManagerPolicy": "none", "topologyManagerPolicy": "none",  # nri-numa places
        "failSwapOn": False, "enforceNodeAllocatable": [],
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "makeIPTablesUtilChains": False, "nodeStatusUpdateFrequency": "4s",
    }))
    run_unit(UNITS[0], [plan["kubelet"], f"--config={config}", f"--kubeconfig={kubeconfig}",
                        "--container-runtime=remote",
                        f"--container-runtime-endpoint=unix://{containerd.address}",
                        f"--root-dir={kubelet_root}", f"--cert-dir={BASE / 'kubelet-pki'}",
                        f"--hostname-override={plan['node']}", "--v=1"])
    return answer


def down() -> dict:
    """Stops the kubelet, removes its pods through CRI, stops the agent and containerd; removes
    what they left (mounts, the pods' slices, the folder) and the fixed paths kubelet 1.20 writes."""
    answer: dict[str, object] = {"problems": []}
    problems: list[str] = answer["problems"]  # type: ignore[assignment]
    began = time.monotonic()

    def took(what: str) -> None:
        answer[f"{what}_s"] = round(time.monotonic() - began, 1)

    sh("systemctl", "stop", UNITS[0])
    took("kubelet_stopped")
    runtimes = find_runtimes()
    containerd = daemon(runtimes, "unused")
    if containerd.paths.grpc_socket.exists():
        client = containerd.cri()
        try:
            for sandbox in client.list_pods():  # the kubelet's, so not the client's remove_all
                client.stop_pod(sandbox.id)
                client.remove_pod(sandbox.id)
        except Exception as exc:  # noqa: BLE001 - reported; the rest goes on
            problems.append(f"removing the pods: {exc}")
        finally:
            client.close()
    took("pods_removed")
    for unit in UNITS[1:]:
        sh("systemctl", "stop", unit)
        took(f"{unit}_stopped")
    sh("systemctl", "stop", "kubepods.slice")
    sh("systemctl", "reset-failed", *UNITS)
    problems += containerd.cleanup()
    problems += _unmount_under(BASE)
    shutil.rmtree(BASE, ignore_errors=True)
    for path in ("/var/lib/kubelet", "/var/log/pods", "/var/log/containers"):
        shutil.rmtree(path, ignore_errors=True)
    took("down")
    return answer


def main(argv: list[str]) -> int:
    try:
        answer = up(json.load(sys.stdin)) if argv == ["up"] else down()
    except Exception:  # noqa: BLE001 - the host shows it with the units' journals
        answer = {"error": traceback.format_exc(),
                  "journals": {unit: journal(unit) for unit in UNITS}}
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
