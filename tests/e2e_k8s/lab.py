"""A real one-node Kubernetes v1.20.2 on 127.0.0.1 with nri-numa placing its containers: the lab
behind `scripts/k8s-lab` and the tests in tests/e2e_k8s (one implementation for both).

`Lab(folder).up(...)` starts, each as its own process recorded by pid in ``<folder>/lab.json``:
etcd, kube-apiserver (client certificates and tokens, Node and RBAC authorization: each
component its own identity), kube-controller-manager, kube-scheduler, containerd
1.7.24 (NRI on, CRI with a CNI bridge network, the e2e busybox image imported), ``nri-numa run``
(static CPU policy, CPU 0 reserved, single-numa-node, the kubelet's PodResources socket) and the
kubelet (CPU and Topology Manager off, cgroupfs, its pods under its own cgroup root). It writes
``kubeconfig`` and ``env`` in the folder. `Lab(folder).down()` stops them by pid and undoes what
they did to the machine: mounts, the pods' cgroups, the CNI bridge, the sysctls the kubelet sets,
``net.ipv4.ip_forward``, and the host folders a 1.20 kubelet writes whatever its root dir (only
those that did not exist before). A failed or interrupted bring-up tears itself down.

One lab per machine: kubelet 1.20 uses fixed host paths and garbage-collects ``/var/log/pods``
entries its apiserver does not know. ``/run/nri-numa-k8s-lab`` names the folder of the lab
that runs.

    python -m tests.e2e_k8s.lab build | up DIR | down DIR     (scripts/k8s-lab wraps this)
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from tests.certificates import make_ca, make_signed
from tests.e2e.harness.cgroups import detect_layout, remove_cgroups
from tests.e2e.harness.containerd import ContainerdDaemon, _unmount_under
from tests.e2e.harness.cri import CriClient
from tests.e2e.harness.image import IMAGE_REF, build_image, import_image
from tests.e2e.harness.runtimes import (REPO, ContainerdBinaries, RuntimesUnavailable,
                                        ensure_runtimes, find_runtimes)
from tests.e2e_k8s.kube import ApiError, Kube, wait_for

K8S_VERSION = "v1.20.2"
CACHE = Path(os.environ.get("NRI_NUMA_K8S_CACHE", f"/var/cache/nri-numa/k8s-{K8S_VERSION}"))
K8S_DEPS = REPO / "scripts" / "k8s-deps"
K8S_BINARIES = ("kube-apiserver", "kubelet", "kube-scheduler", "kube-controller-manager", "kubectl")
AGENT = REPO / ".venv" / "bin" / "nri-numa"
PYTHON = REPO / ".venv" / "bin" / "python"
CONTAINERD_VERSION = "1.7.24"  # kubelet 1.20 speaks CRI v1alpha2, which containerd 2.x dropped
CNI_PLUGINS = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
NODE_NAME = "localhost"  # the apiserver reaches the kubelet by this name: always 127.0.0.1
CGROUP_ROOT = "/nri-numa-lab"  # the kubelet's --cgroup-root: apart from other tests' /kubepods
BRIDGE = "nrinuma0"
POD_SUBNET = "10.237.0.0/24"
HOST_PATHS = ("/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/var/lib/cni")
KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")  # setupKernelTunables
IP_FORWARD = "net/ipv4/ip_forward"  # the CNI bridge plugin may turn it on
NETNS_DIR = Path("/var/run/netns")
OWNER_FILE = Path("/run/nri-numa-k8s-lab")
# Kubelet 1.20 serves its device plugin Registration here whatever its --root-dir says.
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEVICE_PLUGIN = "fake-device-plugin"  # the lab's name for python -m nri_numa.fake_device_plugin
NRT_CRD = REPO / "packaging" / "kubernetes" / "noderesourcetopology-crd.yaml"
NRT_CRD_NAME = "noderesourcetopologies.topology.node.k8s.io"
NRT_RESYNC_S = 5  # the agent reads its NodeResourceTopology back this often and mends it
EVICT_AFTER_REFUSALS = 2  # a controller's pod refused this often is evicted (no delay)
AGENT_CONFIG = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
                "topologyManagerPolicy": "single-numa-node"}
MAX_SOCKET_PATH = 100  # unix socket paths are limited to 108 bytes
# Generous: the bring-up shares a 2-CPU machine with whatever else runs there.
APISERVER_READY_S = 120.0
NODE_READY_S = 180.0
STOP_TIMEOUT_S = 15.0
# The order of the tear-down: the kubelet first, so that it restarts nothing; etcd last.
# nri-numa-extender and virtual-nodes: tests/e2e_k8s/extender_lab.py (the keeper deletes its
# nodes as it stops, so it goes while the apiserver still answers).
STOP_ORDER = ("kubelet", DEVICE_PLUGIN, "kube-scheduler", "nri-numa-extender", "virtual-nodes",
              "kube-controller-manager", "nri-numa", "containerd", "kube-apiserver", "etcd")

# The users of the lab's control plane components (their kubeconfigs: <folder>/<component>.kubeconfig).
COMPONENT_USERS = {"kube-controller-manager": "system:kube-controller-manager",
                   "kube-scheduler": "system:kube-scheduler"}
AGENT_SERVICE_ACCOUNT = "system:serviceaccount:kube-system:nri-numa"  # the apiserver audits it
# The apiserver's names besides 127.0.0.1 and localhost: the in-cluster ones, as kubeadm's has.
API_SERVER_NAMES = ("IP:10.0.0.1", "DNS:kubernetes", "DNS:kubernetes.default",
                    "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local")

Progress = Callable[[str], None]


class LabUnavailable(Exception):
    """What the lab runs is not on this machine (str() says what and how to get it)."""


class LabFailed(RuntimeError):
    """The bring-up failed; the message ends with the tail of the log of what failed."""


@dataclass(frozen=True)
class K8sBinaries:
    bindir: Path
    etcd: Path
    debian_version: str

    def __getitem__(self, name: str) -> Path:
        return self.bindir / name


def find_binaries(cache: Path = CACHE) -> K8sBinaries:
    """The binaries scripts/k8s-deps built and fetched; LabUnavailable with the reason otherwise."""
    stamp, etcd = cache / "bin" / ".complete", cache / "etcd" / "usr" / "bin" / "etcd"
    missing = [str(cache / "bin" / name) for name in K8S_BINARIES if not os.access(cache / "bin" / name, os.X_OK)]
    if not stamp.is_file():
        missing.insert(0, str(stamp))
    if not os.access(etcd, os.X_OK):
        missing.append(str(etcd))
    if not os.access(CNI_PLUGINS / "bridge", os.X_OK):
        missing.append(f"{CNI_PLUGINS}/bridge (Debian containernetworking-plugins)")
    if missing:
        last_error = cache / "last-error"
        why = f"; its last run failed: {last_error.read_text().strip()}" if last_error.is_file() else ""
        raise LabUnavailable(f"not built or fetched yet ({', '.join(missing[:3])}"
                             f"{' ...' if len(missing) > 3 else ''}): run scripts/k8s-deps as root, "
                             f"a cold build takes about 10 minutes{why}")
    return K8sBinaries(cache / "bin", etcd, stamp.read_text().strip())


def ensure_binaries(progress: Progress) -> K8sBinaries:
    """find_binaries, running scripts/k8s-deps first (its progress lines on stderr) when needed."""
    try:
        return find_binaries()
    except LabUnavailable as missing:
        progress(f"{missing}; running {K8S_DEPS.name} now")
    if subprocess.run([str(K8S_DEPS)], check=False).returncode != 0:
        raise LabUnavailable(f"{K8S_DEPS} failed (see above)")
    return find_binaries()


def _established(kube: Kube, crd: str) -> bool:
    try:
        found = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
    except ApiError:
        return False
    return any(c.get("type") == "Established" and c.get("status") == "True"
               # A CRD just created may say "conditions": null until the apiserver fills them.
               for c in (found.get("status") or {}).get("conditions") or [])


def _exists(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
    except ApiError:
        return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _sysctl(name: str) -> str:
    return Path("/proc/sys", name).read_text().strip()


def _set_sysctl(name: str, value: str) -> None:
    Path("/proc/sys", name).write_text(value + "\n")


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (the start time in clock ticks); None when gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: init reaps it


@dataclass
class Recorded:
    """What ``lab.json`` keeps: enough for a later `down` (another process) to undo everything."""

    ports: dict[str, int] = field(default_factory=dict)
    token: str = ""
    pids: dict[str, list[object]] = field(default_factory=dict)  # name → [pid, start time]
    host_paths_before: list[str] = field(default_factory=list)
    netns_before: list[str] = field(default_factory=list)
    sysctls_before: dict[str, str] = field(default_factory=dict)
    containerd_bindir: str = ""
    claimed: bool = False  # the machine-wide changes below are this lab's to undo
    timings: dict[str, float] = field(default_factory=dict)


class Lab:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder).absolute()
        self.state_file = self.folder / "lab.json"
        self.logs = self.folder / "logs"
        self.recorded = Recorded()
        if self.state_file.is_file():
            self.recorded = Recorded(**json.loads(self.state_file.read_text()))
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._argv: dict[str, list[str]] = {}  # how each process was started, for restart()
        self._containerd: ContainerdDaemon | None = None

    # --- where things are -----------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.folder / "kubeconfig"

    def component_kubeconfig(self, component: str) -> Path:
        """The kubeconfig of the kubelet, kube-scheduler or kube-controller-manager."""
        return self.folder / f"{component}.kubeconfig"

    @property
    def env_file(self) -> Path:
        return self.folder / "env"

    @property
    def containerd_base(self) -> Path:
        return self.folder / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_base / "containerd.sock"

    @property
    def nri_socket(self) -> Path:
        return self.containerd_base / "nri" / "nri.sock"

    @property
    def kubelet_root(self) -> Path:
        return self.folder / "kubelet"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    @property
    def agent_log(self) -> Path:
        return self.logs / "nri-numa.log"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.recorded.ports['apiserver']}"

    def kube(self, binaries: K8sBinaries | None = None) -> Kube:
        kubectl = (binaries or find_binaries())["kubectl"]
        return Kube(self.server, self.recorded.token, kubectl, self.kubeconfig)

    def cri(self) -> CriClient:
        return CriClient(str(self.containerd_socket))

    def keep_logs(self, kept: Path) -> Path:
        """The logs copied into ``kept``, then the lab's folder removed (after `down`)."""
        if self.logs.is_dir():
            shutil.copytree(self.logs, kept, dirs_exist_ok=True)
        shutil.rmtree(self.folder, ignore_errors=True)
        return kept

    def log_tail(self, name: str, lines: int = 30) -> str:
        log = self.logs / f"{name}.log"
        text = log.read_text(errors="replace").splitlines() if log.is_file() else ["(no log)"]
        return f"--- {log}, last {lines} lines ---\n" + "\n".join(text[-lines:])

    def _save(self) -> None:
        self.state_file.write_text(json.dumps(asdict(self.recorded), indent=1) + "\n")

    # --- up -------------------------------------------------------------------------------

    def up(self, binaries: K8sBinaries, containerd: ContainerdBinaries, busybox: Path,
           progress: Progress = lambda line: None, host_agent: bool = True) -> float:
        """Brings the whole node up and returns the seconds it took; tears down what it started
        and raises when something fails (LabFailed) or on Ctrl-C. ``host_agent`` False: no
        ``nri-numa run`` process; the caller runs the agent another way (its DaemonSet,
        tests/e2e_k8s_install)."""
        began = time.monotonic()
        self._check_machine()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        try:
            self._claim_machine()
            self._bring_up(binaries, containerd, busybox, began, progress, host_agent)
        except BaseException as exc:
            progress("bring-up failed: tearing down what was started")
            problems = self.down()
            if problems:
                progress(f"the tear-down left: {problems}")
            if isinstance(exc, (LabFailed, LabUnavailable)) or not isinstance(exc, Exception):
                raise  # Ctrl-C and the like too
            raise LabFailed(f"{type(exc).__name__}: {exc}") from exc
        took = time.monotonic() - began
        self.recorded.timings["up"] = round(took, 1)
        self._save()
        return took

    def _check_machine(self) -> None:
        if os.geteuid() != 0:
            raise LabUnavailable("the lab needs root: it runs containerd and a kubelet")
        if self.state_file.exists():
            raise LabFailed(f"{self.folder} holds a lab already: scripts/k8s-lab down {self.folder}")
        longest = self.containerd_socket.with_name("containerd.sock.ttrpc")
        for path in (longest, self.pod_resources_socket):
            if len(str(path)) > MAX_SOCKET_PATH:
                raise LabFailed(f"{self.folder} is too long a path: {path} would exceed the "
                                f"108-byte limit of unix socket paths; use a shorter folder")
        if (os.cpu_count() or 1) < 2:
            raise LabUnavailable("nri-numa reserves CPU 0: the lab needs at least 2 CPUs")
        routes = subprocess.run(["ip", "-4", "route", "show", "match", POD_SUBNET],
                                capture_output=True, text=True, check=False).stdout.splitlines()
        overlapping = [r for r in routes if r.strip() and not r.startswith("default")]
        if overlapping:
            raise LabFailed(f"the pod network {POD_SUBNET} overlaps a route of this machine: {overlapping}")

    def _claim_machine(self) -> None:
        """One lab per machine; a stale claim (its folder torn down or gone) is taken over."""
        if OWNER_FILE.is_file():
            other = Path(OWNER_FILE.read_text().strip())
            if other != self.folder and (other / "lab.json").is_file():
                raise LabFailed(f"another lab holds this machine ({other}): scripts/k8s-lab down {other}")
        OWNER_FILE.write_text(f"{self.folder}\n")
        self.recorded.host_paths_before = [p for p in HOST_PATHS if os.path.lexists(p)]
        self.recorded.netns_before = sorted(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else []
        self.recorded.sysctls_before = {name: _sysctl(name) for name in (*KUBELET_SYSCTLS, IP_FORWARD)}
        self.recorded.claimed = True
        self._save()

    def _bring_up(self, binaries: K8sBinaries, containerd: ContainerdBinaries, busybox: Path,
                  began: float, progress: Progress, host_agent: bool) -> None:
        def step(text: str) -> None:
            progress(f"[{time.monotonic() - began:5.1f}s] {text}")

        self.recorded.ports = {name: free_port() for name in
                               ("etcd", "etcd-peer", "apiserver", "kubelet", "metrics")}
        self.recorded.token = secrets.token_hex(16)
        self.recorded.containerd_bindir = str(containerd.bindir)
        self._save()
        self._write_credentials()
        kube = self.kube(binaries)

        step("starting etcd")
        etcd_url = f"http://127.0.0.1:{self.recorded.ports['etcd']}"
        peer_url = f"http://127.0.0.1:{self.recorded.ports['etcd-peer']}"
        self._start("etcd", [str(binaries.etcd), "--name", "lab", "--data-dir", str(self.folder / "etcd"),
                             "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                             "--initial-cluster", f"lab={peer_url}"])
        pki = self.folder / "pki"
        step("starting kube-apiserver (client certificates and tokens; Node and RBAC authorization)")
        self._start("kube-apiserver", [
            str(binaries["kube-apiserver"]), f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1",
            f"--secure-port={self.recorded.ports['apiserver']}", "--insecure-port=0",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            # what nri-numa's ServiceAccount does, one line each (tests/e2e_k8s_install)
            f"--audit-policy-file={pki / 'audit-policy.yaml'}", f"--audit-log-path={self.audit_log}",
            # kubectl logs/exec: the apiserver dials the kubelet by the node's name, localhost.
            "--kubelet-preferred-address-types=Hostname,InternalIP", "--profiling=false"])
        self._wait(kube.readyz, APISERVER_READY_S, "kube-apiserver to answer /readyz ok", "kube-apiserver")
        step("kube-apiserver ready; the NodeResourceTopology CRD applied; starting "
             "kube-controller-manager and kube-scheduler")
        kube.apply(yaml.safe_load_all(NRT_CRD.read_text()))
        self._wait(lambda: _established(kube, NRT_CRD_NAME), 30.0,
                   "the NodeResourceTopology CRD to be Established", "kube-apiserver")
        self._start("kube-controller-manager", [
            str(binaries["kube-controller-manager"]),
            f"--kubeconfig={self.component_kubeconfig('kube-controller-manager')}",
            "--leader-elect=false", "--port=0", "--secure-port=0",
            # each controller as its own ServiceAccount (the bootstrap system:controller:* roles)
            "--use-service-account-credentials", f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-account-private-key-file={pki / 'sa.key'}"])
        self._start("kube-scheduler", [str(binaries["kube-scheduler"]),
                                       f"--kubeconfig={self.component_kubeconfig('kube-scheduler')}",
                                       "--leader-elect=false", "--port=0", "--secure-port=0"])

        step(f"starting containerd {containerd.version} (NRI on, CNI bridge {BRIDGE} {POD_SUBNET})")
        self._start_containerd(containerd)
        image = build_image(busybox, self.folder)
        import_image(containerd.ctr, str(self.containerd_socket), image)
        (self.folder / image.tarball.name).unlink()
        if host_agent:
            step(f"image {image.ref} imported; starting nri-numa run")
            self._start_agent()
            self._wait(self._agent_connected, 30.0, "containerd to connect nri-numa", "nri-numa")
            step("nri-numa connected; starting the kubelet")
        else:
            step(f"image {image.ref} imported; starting the kubelet")
        self._start_kubelet(binaries)
        self._wait(lambda: kube.node_schedulable(NODE_NAME), NODE_READY_S,
                   f"node {NODE_NAME} to be Ready and untainted", "kubelet")
        # The ServiceAccount admission plugin admits a namespace's pods once its default
        # ServiceAccount is there (made by kube-controller-manager).
        self._wait(lambda: _exists(kube, "/api/v1/namespaces/default/serviceaccounts/default"), 60.0,
                   "the default namespace's ServiceAccount", "kube-controller-manager")
        self._write_env(binaries)
        step(f"node {NODE_NAME} Ready")

    def _write_credentials(self) -> None:
        """Each component its own identity, as on a real control plane: the apiserver serves a
        certificate of the lab's CA (which the pods' service account tokens carry as ca.crt);
        the kubelet is system:node:localhost of group system:nodes by a client certificate of
        that CA (the Node authorizer's subject); kube-controller-manager and kube-scheduler are
        system:kube-controller-manager and system:kube-scheduler by token (the bootstrap RBAC
        roles of those names); the tests and `kubectl` are the lab's admin (system:masters)."""
        pki = self.folder / "pki"
        pki.mkdir(exist_ok=True)
        ca = make_ca(pki, "ca")
        make_signed(pki, "apiserver", ca, server=True, extra_names=API_SERVER_NAMES)
        make_signed(pki, "kubelet-client", ca, server=False,
                    subject=f"/O=system:nodes/CN=system:node:{NODE_NAME}")
        tokens = {user: secrets.token_hex(16) for user in COMPONENT_USERS.values()}
        (pki / "tokens.csv").write_text(
            f"{self.recorded.token},admin,admin,system:masters\n"
            + "".join(f"{token},{user},{user}\n" for user, token in tokens.items()))
        (pki / "audit-policy.yaml").write_text(json.dumps({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata", "users": [AGENT_SERVICE_ACCOUNT]}, {"level": "None"}]}))
        for argv in (["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"],
                     ["openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")]):
            subprocess.run(argv, capture_output=True, check=True)
        self._write_kubeconfig(self.kubeconfig, "admin (system:masters)", f"token: {self.recorded.token}")
        for component, user in COMPONENT_USERS.items():
            self._write_kubeconfig(self.component_kubeconfig(component), user, f"token: {tokens[user]}")
        self._write_kubeconfig(self.component_kubeconfig("kubelet"), f"system:node:{NODE_NAME}",
                               f"client-certificate: {pki / 'kubelet-client.crt'}\n"
                               f"    client-key: {pki / 'kubelet-client.key'}")

    def _write_kubeconfig(self, path: Path, who: str, credentials: str) -> None:
        path.write_text(
            f"# The lab's {who}.\napiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: nri-numa-lab\n  cluster:\n    server: {self.server}\n"
            f"    certificate-authority: {self.folder / 'pki' / 'ca.crt'}\n"
            f"users:\n- name: user\n  user:\n    {credentials}\n"
            "contexts:\n- name: nri-numa-lab\n  context:\n    cluster: nri-numa-lab\n    user: user\n"
            "    namespace: default\ncurrent-context: nri-numa-lab\n")
        path.chmod(0o600)

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> None:
        """Stop one of the lab's processes (a test's outage); ``restart`` starts it again."""
        child = self._children[name]
        child.send_signal(sig)
        child.wait(timeout=timeout_s)

    def restart(self, name: str) -> None:
        self._start(name, self._argv[name])

    def restart_agent(self, topology: Path | None = None) -> None:
        """Stop ``nri-numa run`` and start it again on ``topology`` (a topology JSON file, in
        place of what it discovers on this machine), or on the machine again with None; each
        with a state folder of its own, so that neither restores placements made on the other
        machine. Returns once containerd has connected the new agent."""
        connected_before = self._agent_connections()
        problems = self._stop("nri-numa")
        if problems:
            raise LabFailed(f"restarting nri-numa: {problems}")
        self._start_agent(topology)
        self._wait(lambda: self._agent_connections() > connected_before, 30.0,
                   "containerd to connect the restarted nri-numa", "nri-numa")

    def start_device_plugin(self, device_file: Path) -> None:
        """Start the fake device plugin (``python -m nri_numa.fake_device_plugin``) against the
        kubelet, advertising what ``device_file`` says (read again when it changes); returns once
        it has registered. ``down`` stops it with the rest; ``stop_device_plugin`` before."""
        self._start(DEVICE_PLUGIN, [str(PYTHON), "-m", "nri_numa.fake_device_plugin",
                                    "--devices", str(device_file), "--plugin-dir", str(DEVICE_PLUGIN_DIR)])
        self._wait(lambda: "registered " in self.log_tail(DEVICE_PLUGIN, 20), 30.0,
                   "the fake device plugin to register with the kubelet", DEVICE_PLUGIN)

    def stop_device_plugin(self) -> list[str]:
        """Stop the fake device plugin; what could not be stopped."""
        if DEVICE_PLUGIN not in self.recorded.pids:
            return []
        problems = self._stop(DEVICE_PLUGIN)
        del self.recorded.pids[DEVICE_PLUGIN]
        self._children.pop(DEVICE_PLUGIN, None)
        self._save()
        return problems

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self._argv[name] = argv
        with (self.logs / f"{name}.log").open("ab") as log:
            log.write(f"=== k8s-lab: {' '.join(argv)} ===\n".encode())
            log.flush()
            child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=self.folder, env=env, start_new_session=True)
        self._children[name] = child
        self.recorded.pids[name] = [child.pid, _start_time(child.pid)]
        self._save()

    def _alive(self, name: str) -> bool:
        pid, started = self.recorded.pids.get(name, [0, None])
        return bool(pid) and started is not None and _start_time(int(pid)) == started

    def _wait(self, condition: Callable[[], object], timeout_s: float, what: str, log_name: str) -> None:
        """Waits for ``condition``, failing at once when a process of the lab has died."""
        def check() -> object:
            dead = [name for name in self.recorded.pids if not self._alive(name)]
            if dead:
                raise LabFailed(f"{', '.join(dead)} exited while waiting for {what}\n"
                                + "\n".join(self.log_tail(name) for name in dead))
            return condition()
        try:
            wait_for(check, timeout_s, what, poll_s=0.2)
        except TimeoutError as exc:
            raise LabFailed(f"{exc}\n{self.log_tail(log_name)}") from None

    def _start_containerd(self, binaries: ContainerdBinaries) -> None:
        # containerd's CRI runs the CNI plugins from its cni/bin with the config in cni/net.d.
        cni = self.containerd_base / "cni"
        (cni / "bin").mkdir(parents=True, exist_ok=True)
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        for plugin in ("bridge", "host-local", "loopback", "portmap"):
            (cni / "bin" / plugin).symlink_to(CNI_PLUGINS / plugin)
        (cni / "net.d" / "10-nri-numa-lab.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "nri-numa-lab", "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                         "dataDir": str(self.folder / "cni-ipam")}}]}, indent=1))
        daemon = ContainerdDaemon(binaries, self.containerd_base, IMAGE_REF, log=self.logs / "containerd.log")
        self._containerd = daemon
        try:
            daemon.start(timeout_s=60.0)
        finally:
            if daemon.process is not None:
                self._children["containerd"] = daemon.process
                self.recorded.pids["containerd"] = [daemon.process.pid, _start_time(daemon.process.pid)]
                self._save()

    def _start_agent(self, topology: Path | None = None) -> None:
        folder = self.folder / "nri-numa"
        folder.mkdir(exist_ok=True)
        config = folder / "config.yaml"
        config.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in AGENT_CONFIG.items()))
        machine = ["--topology", str(topology)] if topology is not None else []
        state = folder / ("state" if topology is None else f"state-{topology.stem}")
        self._start("nri-numa", [
            str(AGENT), "run", "--nri-socket", str(self.nri_socket), "--config", str(config), *machine,
            "--state-dir", str(state), "--pod-resources-socket", str(self.pod_resources_socket),
            "--metrics-address", f"127.0.0.1:{self.recorded.ports['metrics']}",
            "--log-file", str(self.agent_log), "--kubeconfig", str(self.kubeconfig),
            "--node-name", NODE_NAME, "--nrt-resync-period", str(NRT_RESYNC_S),
            "--evict-after-refusals", str(EVICT_AFTER_REFUSALS), "--eviction-delay", "0"])

    def _agent_connected(self) -> bool:
        return self._agent_connections() > 0

    def _agent_connections(self) -> int:
        """How often containerd has logged nri-numa connecting."""
        log = self.logs / "containerd.log"
        return log.read_text(errors="replace").count('plugin \\"90-nri-numa\\" connected') if log.is_file() else 0

    def _start_kubelet(self, binaries: K8sBinaries) -> None:
        self._make_cgroup_root()
        config = self.folder / "kubelet.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": "127.0.0.1", "port": self.recorded.ports["kubelet"], "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "cgroupRoot": CGROUP_ROOT,
            # nri-numa places the CPUs: the kubelet's own managers stay off. (1.20 has no
            # Memory Manager yet: memoryManagerPolicy came with 1.21.)
            "cpuManagerPolicy": "none", "topologyManagerPolicy": "none",
            "failSwapOn": False, "enforceNodeAllocatable": [],
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,  # keep the image
            "makeIPTablesUtilChains": False,  # no KUBE-* iptables chains on the host
            "nodeStatusUpdateFrequency": "4s",
        }, indent=1))
        self._start("kubelet", [
            str(binaries["kubelet"]), f"--config={config}",
            f"--kubeconfig={self.component_kubeconfig('kubelet')}",
            "--container-runtime=remote", f"--container-runtime-endpoint=unix://{self.containerd_socket}",
            f"--root-dir={self.kubelet_root}", f"--cert-dir={self.folder / 'pki' / 'kubelet'}",
            f"--hostname-override={NODE_NAME}", f"--containerd={self.containerd_socket}", "--v=1"])

    def _make_cgroup_root(self) -> None:
        """The kubelet refuses a --cgroup-root missing from a hierarchy; cgroup v1's cpuset needs
        its cpus and mems filled before anything can join below."""
        layout = detect_layout()
        for hierarchy in layout.hierarchies:
            folder = hierarchy / CGROUP_ROOT.lstrip("/")
            folder.mkdir(exist_ok=True)
            if layout.version == 1 and (folder / "cpuset.cpus").exists():
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (folder / name).write_text((hierarchy / name).read_text())
            if layout.version == 2:
                offered = (folder / "cgroup.controllers").read_text().split()
                (folder / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in offered))

    def _write_env(self, binaries: K8sBinaries) -> None:
        ports = self.recorded.ports
        self.env_file.write_text(
            f"# The nri-numa Kubernetes lab in {self.folder}: `. {self.env_file}`, then kubectl.\n"
            f"export KUBECONFIG={self.kubeconfig}\n"
            f"export PATH={binaries.bindir}:$PATH\n"
            f"export NRI_NUMA_LAB={self.folder}\n"
            f"export NRI_NUMA_LAB_NODE={NODE_NAME}\n"
            f"export NRI_NUMA_LAB_IMAGE={IMAGE_REF}\n"
            f"export NRI_NUMA_LAB_AGENT_LOG={self.agent_log}\n"
            f"export NRI_NUMA_LAB_METRICS=http://127.0.0.1:{ports['metrics']}/metrics\n"
            f"export NRI_NUMA_LAB_CTR=\"{self.recorded.containerd_bindir}/ctr"
            f" --address {self.containerd_socket} --namespace k8s.io\"\n"
            f"export NRI_NUMA_LAB_CGROUP_ROOT={CGROUP_ROOT}\n")

    # --- down -----------------------------------------------------------------------------

    def down(self, progress: Progress = lambda line: None) -> list[str]:
        """Stops everything the lab started and undoes what it did to the machine; returns what
        could not be undone (empty: all clean). Safe to run twice, or after a failed up."""
        problems: list[str] = []
        pids = self.recorded.pids
        for name in STOP_ORDER:
            if name not in pids:
                continue
            if name == "containerd":
                problems += self._remove_pods(progress)
            progress(f"stopping {name}")
            problems += self._stop(name)
        if self.recorded.containerd_bindir:
            binaries = ContainerdBinaries(CONTAINERD_VERSION, "", Path(self.recorded.containerd_bindir))
            problems += ContainerdDaemon(binaries, self.containerd_base, IMAGE_REF,
                                         log=self.logs / "containerd.log").cleanup()
        problems += _unmount_under(self.folder)
        if self.recorded.claimed:
            progress("removing the pods' cgroups and the CNI bridge; restoring sysctls and host folders")
            problems += [f"cgroup {p}" for p in remove_cgroups(detect_layout(), [CGROUP_ROOT])]
            problems += self._undo_host_changes()
            if OWNER_FILE.is_file() and OWNER_FILE.read_text().strip() == str(self.folder):
                OWNER_FILE.unlink()
        for entry in self.folder.iterdir() if self.folder.is_dir() else []:
            if entry != self.logs:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                if entry.exists():
                    problems.append(f"{entry} could not be removed")
        return problems

    def _remove_pods(self, progress: Progress) -> list[str]:
        """With the kubelet stopped, every pod sandbox is stopped and removed through CRI: that
        runs the CNI DEL (veth, IP lease, network namespace) while containerd still runs."""
        if not self._alive("containerd") or not self.containerd_socket.exists():
            return []
        problems = []
        client = self.cri()
        try:
            sandboxes = client.list_pods()
            if sandboxes:
                progress(f"removing {len(sandboxes)} pod sandboxes through CRI")
            for sandbox in sandboxes:
                try:
                    client.stop_pod(sandbox.id)
                    client.remove_pod(sandbox.id)
                except Exception as exc:  # noqa: BLE001 (reported, the tear-down goes on)
                    problems.append(f"remove pod sandbox {sandbox.id[:12]}: {exc}")
        except Exception as exc:  # noqa: BLE001
            problems.append(f"listing pod sandboxes: {exc}")
        finally:
            client.close()
        return problems

    def _stop(self, name: str) -> list[str]:
        pid = int(self.recorded.pids[name][0])
        if not self._alive(name):
            _reap(pid)
            return []
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self._alive(name):
            _reap(pid)
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 5
                time.sleep(0.2)
                _reap(pid)
                if self._alive(name):
                    return [f"{name} (pid {pid}) survived SIGKILL"]
            time.sleep(0.05)
        _reap(pid)
        return []

    def _undo_host_changes(self) -> list[str]:
        problems = []
        if Path(f"/sys/class/net/{BRIDGE}").exists():
            done = subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                problems.append(f"ip link delete {BRIDGE}: {done.stderr.strip()}")
        before = set(self.recorded.netns_before)
        for name in sorted(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else []:
            if name.startswith("cni-") and name not in before:
                subprocess.run(["umount", "--lazy", str(NETNS_DIR / name)], capture_output=True, check=False)
                (NETNS_DIR / name).unlink(missing_ok=True)
        for name, value in self.recorded.sysctls_before.items():
            try:
                if _sysctl(name) != value:
                    _set_sysctl(name, value)
            except OSError as exc:
                problems.append(f"sysctl {name}: {exc}")
        for path in HOST_PATHS:
            if path not in self.recorded.host_paths_before and os.path.lexists(path):
                shutil.rmtree(path, ignore_errors=True)
                if os.path.lexists(path):
                    problems.append(f"{path} could not be removed")
        return problems


# --- command line (scripts/k8s-lab) --------------------------------------------------------------

USAGE = """usage: scripts/k8s-lab build | up DIR [--scheduler-extender] | down DIR
  build     build Kubernetes v1.20.2 and fetch etcd into the machine-wide cache (scripts/k8s-deps)
  up DIR    start the one-node cluster with nri-numa in DIR (a short path: sockets live there);
            then `. DIR/env` and use kubectl
            --scheduler-extender: and four virtual nodes (two dgx-h100, an amd-epyc-2s-nps4, a
            gb200), with kube-scheduler asking nri-numa's scheduler extender about every pod
  down DIR  stop it and undo everything it did to the machine (DIR/logs stays)"""


def _say(line: str) -> None:
    print(f"k8s-lab: {line}", file=sys.stderr, flush=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    if len(argv) == 1 and argv[0] == "build":
        return subprocess.run([str(K8S_DEPS)], check=False).returncode
    extender = argv[2:] == ["--scheduler-extender"] and argv[0] == "up"
    if len(argv) != 2 + extender or argv[0] not in ("up", "down"):
        print(USAGE, file=sys.stderr)
        return 2
    lab = Lab(Path(argv[1]))
    if argv[0] == "down":
        if not lab.state_file.is_file():
            _say(f"no lab in {lab.folder} (no lab.json): nothing to do")
            return 0
        problems = lab.down(_say)
        for problem in problems:
            _say(f"left behind: {problem}")
        _say(f"down{' with problems' if problems else ''}; the logs stay in {lab.logs}")
        return 1 if problems else 0
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    try:
        binaries = ensure_binaries(_say)
        try:
            runtimes = find_runtimes()
        except RuntimesUnavailable:
            _say("fetching the container runtimes (scripts/e2e-deps)")
            runtimes = ensure_runtimes()
        took = lab.up(binaries, runtimes.containerd[CONTAINERD_VERSION], runtimes.busybox, _say)
        if extender:
            _start_extender(lab, binaries)
    except (LabUnavailable, LabFailed, RuntimesUnavailable) as exc:
        _say(f"failed: {exc}")
        return 1
    except KeyboardInterrupt:
        _say("interrupted: torn down")
        return 130
    _say(f"up in {took:.1f} s. Logs: {lab.logs}/. Try:\n"
         f"  . {lab.env_file}\n  kubectl get nodes\n"
         f"  kubectl run be --image=$NRI_NUMA_LAB_IMAGE --image-pull-policy=Never\n"
         + ("Pods for the virtual nodes tolerate the taint numa.nri.io/virtual-node "
            "(docs/scheduler-extender.md).\n" if extender else "")
         + f"Tear down: scripts/k8s-lab down {lab.folder}")
    return 0


def _start_extender(lab: Lab, binaries: K8sBinaries) -> None:
    from tests.e2e_k8s.extender_lab import ExtenderLab  # it imports this module

    _say("starting four virtual nodes and nri-numa scheduler-extender, then kube-scheduler "
         "again with the extender")
    try:
        ExtenderLab(lab, lab.kube(binaries)).up()
    except BaseException:
        _say("the extender did not come up: tearing the lab down")
        lab.down()
        raise


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
