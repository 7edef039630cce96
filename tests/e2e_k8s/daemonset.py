"""nri-numa installed on the lab as a user installs it (tests/e2e_k8s_install): the image
scripts/image builds, moved into the lab's containerd with `podman save | ctr images import`, and
`kubectl apply -k` of a kustomization whose base is packaging/kubernetes.

The overlay (`write_overlay`) changes what a one-node lab on 127.0.0.1 cannot have as a real node
has it, and nothing else:
- the host folders: the lab's containerd serves NRI in its own folder, its kubelet has its own
  root (its PodResources socket there), and the agent's state, the CDI folders are kept in the
  lab's folder (so that `down` removes them and the host keeps no /etc/cdi the lab made);
- the API server's address: the lab's apiserver listens on 127.0.0.1 only and there is no
  kube-proxy, so the pod shares the host's network and is told 127.0.0.1:<port> in the two
  variables a pod's client reads (KUBERNETES_SERVICE_HOST/PORT, which the kubelet sets to the
  `kubernetes` Service's cluster IP on a real node).
It also sets one thing of nri-numa's own, in the ConfigMap's ``nriNuma:`` map as a user would:
``AGENT_SETTINGS``, evictions at the first refusal, so that the ClusterRole's eviction rule is
seen used within one round of tests/e2e_k8s_install/test_daemonset.py (the packaged defaults, 3
refusals and 30 s, would take most of a minute per round).
The pod's credentials stay the ServiceAccount's: its token and the lab's CA, mounted by the
ServiceAccount admission plugin from the Secret kube-controller-manager made."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

import nri_numa
from tests.e2e.harness.runtimes import REPO
from tests.e2e_k8s.kube import ApiError, Json, Kube, wait_for
from tests.e2e_k8s.lab import Lab, LabFailed

PACKAGE = REPO / "packaging" / "kubernetes"
IMAGE = f"localhost/nri-numa:{nri_numa.__version__}"
PODMAN = "/usr/bin/podman"
NAMESPACE = "kube-system"
NAME = "nri-numa"
DAEMONSET = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{NAME}"
SELECTOR = "app.kubernetes.io/name=nri-numa"
AGENT_UP_S = 90.0
# nri-numa's own settings in the lab's ConfigMap: a refused pod of a controller evicted at once.
AGENT_SETTINGS = {"evictAfterRefusals": 1, "evictionDelay": 0}


def import_images(lab: Lab, refs: list[str], timeout_s: float = 300.0) -> None:
    """`podman save` of ``refs`` (one archive: their shared layers once) into the lab
    containerd's k8s.io namespace, where the kubelet's CRI finds them."""
    ctr = Path(lab.recorded.containerd_bindir) / "ctr"
    save = subprocess.Popen([PODMAN, "save", "--multi-image-archive", *refs],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done = subprocess.run([str(ctr), "--address", str(lab.containerd_socket), "--namespace",
                           "k8s.io", "images", "import", "-"], stdin=save.stdout,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    save.stdout.close()
    saved_error = save.stderr.read().decode(errors="replace")
    if save.wait(timeout=timeout_s) != 0 or done.returncode != 0:
        raise LabFailed(f"podman save {' '.join(refs)} | ctr images import failed: "
                        f"{saved_error.strip()} {done.stderr.strip()}")


def write_overlay(lab: Lab, folder: Path) -> Path:
    """The lab's kustomization over packaging/kubernetes (module docstring); its folder."""
    folder.mkdir(parents=True, exist_ok=True)
    here = lab.folder / "nri-numa-host"
    host_paths = {"nri-socket": lab.nri_socket.parent, "state": here / "state",
                  "pod-resources": lab.pod_resources_socket.parent,
                  "cdi-static": here / "cdi-static", "cdi-dynamic": here / "cdi-dynamic"}
    patch = {"apiVersion": "apps/v1", "kind": "DaemonSet",
             "metadata": {"name": NAME, "namespace": NAMESPACE},
             "spec": {"template": {"spec": {
                 "hostNetwork": True,
                 "containers": [{"name": NAME, "env": [
                     {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                     {"name": "KUBERNETES_SERVICE_PORT", "value": str(lab.recorded.ports["apiserver"])}]}],
                 "volumes": [{"name": name, "hostPath": {"path": str(path)}}
                             for name, path in host_paths.items()]}}}}
    (folder / "lab-paths.yaml").write_text(yaml.safe_dump(patch))
    [config_map] = [d for d in yaml.safe_load_all((PACKAGE / "nri-numa.yaml").read_text())
                    if d["kind"] == "ConfigMap"]
    config = {**yaml.safe_load(config_map["data"]["config.yaml"]), "nriNuma": AGENT_SETTINGS}
    (folder / "agent-settings.yaml").write_text(yaml.safe_dump(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": config_map["metadata"],
         "data": {"config.yaml": yaml.safe_dump(config)}}))
    # kubectl 1.20's kustomize (v2.0.3): a base is a relative folder, patches by file name.
    (folder / "kustomization.yaml").write_text(yaml.safe_dump({
        "bases": [os.path.relpath(PACKAGE, folder)],
        "patchesStrategicMerge": ["lab-paths.yaml", "agent-settings.yaml"]}))
    return folder


def agent_pods(kube: Kube) -> list[Json]:
    return kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={SELECTOR}")["items"]


def running_agent(kube: Kube) -> Json | None:
    """The one agent pod whose container runs (and is not being deleted), else None."""
    running = [p for p in agent_pods(kube) if not p["metadata"].get("deletionTimestamp")
               and any("running" in (s.get("state") or {})
                       for s in p.get("status", {}).get("containerStatuses") or [])]
    return running[0] if len(running) == 1 else None


def wait_agent_connected(lab: Lab, kube: Kube, connections_before: int) -> Json:
    """Waits for an agent pod to run and containerd to have connected one more agent than
    ``connections_before``; that pod."""
    def up() -> Json | None:
        pod = running_agent(kube)
        return pod if pod is not None and lab._agent_connections() > connections_before else None
    try:
        return wait_for(up, AGENT_UP_S, "the nri-numa DaemonSet's pod running and connected",
                        poll_s=0.2)
    except TimeoutError as e:
        raise LabFailed(f"{e}\n{describe(kube)}\n{lab.log_tail('containerd')}") from None


def describe(kube: Kube) -> str:
    try:
        pods = agent_pods(kube)
        events = kube.get(f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    except ApiError as e:
        return f"(the API server: {e})"
    return ("agent pods: " + "; ".join(f"{p['metadata']['name']} {p['status'].get('phase')} "
                                       f"{p['status'].get('containerStatuses')}" for p in pods)
            + "\nevents: " + "; ".join(f"{e['involvedObject']['name']}: {e['reason']} {e['message']}"
                                       for e in events[-10:]))


def install(lab: Lab, kube: Kube, folder: Path) -> str:
    """`kubectl apply -k` of the lab's overlay; returns kubectl's output once the agent runs in
    its pod and containerd has connected it."""
    before = lab._agent_connections()
    out = kube.kubectl("apply", "-k", str(write_overlay(lab, folder)))
    wait_agent_connected(lab, kube, before)
    return out


def agent_log(pod: Json) -> str:
    """The agent container's log as the kubelet keeps it (every restart of the container)."""
    meta = pod["metadata"]
    folder = Path("/var/log/pods") / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / NAME
    return "".join(f.read_text(errors="replace") for f in sorted(folder.glob("*.log")))
