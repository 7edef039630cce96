"""A private containerd of a given version, with NRI on, everything under one folder: root, state,
sockets, NRI plugin paths, runc's state. Nothing of the host's /var/lib/containerd, /run/containerd
(beyond the shims' hashed sockets under /run/containerd/s), /etc/nri or /opt is read or written.

containerd 1.7 reads config format version 2 (one "io.containerd.grpc.v1.cri" plugin); containerd
2.x reads version 3, where CRI is split into "io.containerd.cri.v1.images" (the sandbox image is
"pinned_images.sandbox"), "io.containerd.cri.v1.runtime" (runtimes, CNI, restrict_oom_score_adj)
and "io.containerd.grpc.v1.cri" (the gRPC and streaming server)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from tests.e2e.harness.cri import CriClient
from tests.e2e.harness.runtimes import RUNC, ContainerdBinaries

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


TomlTable = dict[str, object]


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # JSON's string escapes are valid TOML


def to_toml(table: TomlTable, path: tuple[str, ...] = ()) -> str:
    """The little TOML containerd's configs need: strings, bools, ints, lists, nested tables."""
    scalars = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    lines = ([f"[{'.'.join(_toml_key(p) for p in path)}]"] if path else []) + scalars
    text = "\n".join(lines) + "\n" if lines else ""
    for key, value in table.items():
        if isinstance(value, dict):
            text += to_toml(value, (*path, key))
    return text


@dataclass(frozen=True)
class DaemonPaths:
    base: Path
    log: Path  # may live outside `base`, so that it outlives the clean-up

    @property
    def config(self) -> Path:
        return self.base / "config.toml"

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def grpc_socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def nri_socket(self) -> Path:
        return self.base / "nri" / "nri.sock"

    @property
    def nri_plugins(self) -> Path:
        return self.base / "nri" / "plugins"

    @property
    def nri_plugin_config(self) -> Path:
        return self.base / "nri" / "conf.d"

    @property
    def runc_root(self) -> Path:
        return self.base / "runc"

    @property
    def cni(self) -> Path:
        return self.base / "cni"

    @property
    def opt(self) -> Path:
        return self.base / "opt"


def _common(paths: DaemonPaths, version: int, log_level: str) -> TomlTable:
    return {
        "version": version,
        "root": str(paths.root),
        "state": str(paths.state),
        "grpc": {"address": str(paths.grpc_socket)},
        "ttrpc": {"address": f"{paths.grpc_socket}.ttrpc"},
        "debug": {"level": log_level},
    }


def _runc(paths: DaemonPaths, runc: Path, systemd_cgroup: bool = False) -> TomlTable:
    """runc with the cgroupfs driver, or (systemd_cgroup) the systemd one: runc then asks systemd
    for a cri-containerd-<id>.scope in the pod's slice, as on a node whose kubelet uses systemd."""
    return {"runtime_type": "io.containerd.runc.v2",
            "options": {"BinaryName": str(runc), "Root": str(paths.runc_root), "SystemdCgroup": systemd_cgroup}}


def _shared_plugins(paths: DaemonPaths) -> TomlTable:
    return {
        "io.containerd.nri.v1.nri": {
            "disable": False,
            "socket_path": str(paths.nri_socket),
            "plugin_path": str(paths.nri_plugins),
            "plugin_config_path": str(paths.nri_plugin_config),
        },
        "io.containerd.internal.v1.opt": {"path": str(paths.opt)},
    }


def _cdi(spec_dirs: tuple[str, ...] | None) -> TomlTable:
    """CDI off, or on with these spec dirs (the same two keys in both formats)."""
    return {"enable_cdi": False} if spec_dirs is None else {
        "enable_cdi": True, "cdi_spec_dirs": list(spec_dirs)}


def config_v2(paths: DaemonPaths, sandbox_image: str, runc: Path = RUNC, log_level: str = "info",
              cdi_spec_dirs: tuple[str, ...] | None = None, systemd_cgroup: bool = False,
              hugetlb: bool = False) -> TomlTable:
    """containerd 1.7's format: one "io.containerd.grpc.v1.cri" plugin holds all of CRI.
    restrict_oom_score_adj: this VM refuses a negative oom_score_adj (no CAP_SYS_RESOURCE) and runc
    would fail with "can't get final child's PID from pipe"."""
    cri = {
        "sandbox_image": sandbox_image,
        "restrict_oom_score_adj": True,
        "disable_hugetlb_controller": not hugetlb,
        **_cdi(cdi_spec_dirs),
        "stream_server_port": "0",
        "containerd": {"default_runtime_name": "runc", "snapshotter": "overlayfs",
                       "runtimes": {"runc": _runc(paths, runc, systemd_cgroup)}},
        "cni": {"bin_dir": str(paths.cni / "bin"), "conf_dir": str(paths.cni / "net.d")},
    }
    return {**_common(paths, 2, log_level),
            "plugins": {"io.containerd.grpc.v1.cri": cri, **_shared_plugins(paths)}}


def config_v3(paths: DaemonPaths, sandbox_image: str, runc: Path = RUNC, log_level: str = "info",
              cdi_spec_dirs: tuple[str, ...] | None = None, systemd_cgroup: bool = False,
              hugetlb: bool = False) -> TomlTable:
    """containerd 2.x's format: images, runtime and the gRPC server are separate CRI plugins."""
    runtime = {
        "restrict_oom_score_adj": True,
        "disable_hugetlb_controller": not hugetlb,
        **_cdi(cdi_spec_dirs),
        "containerd": {"default_runtime_name": "runc",
                       "runtimes": {"runc": _runc(paths, runc, systemd_cgroup)}},
        "cni": {"bin_dirs": [str(paths.cni / "bin")], "conf_dir": str(paths.cni / "net.d")},
    }
    return {**_common(paths, 3, log_level), "plugins": {
        "io.containerd.cri.v1.images": {"snapshotter": "overlayfs", "pinned_images": {"sandbox": sandbox_image}},
        "io.containerd.cri.v1.runtime": runtime,
        "io.containerd.grpc.v1.cri": {"stream_server_port": "0"},
        "io.containerd.image-verifier.v1.bindir": {"bin_dir": str(paths.base / "verifiers")},
        **_shared_plugins(paths),
    }}


class DaemonFailed(RuntimeError):
    """containerd did not come up (or died); the message ends with the tail of its log."""


class ContainerdDaemon:
    """One private containerd: start, stop, restart, its log, a CRI client, and a clean-up that
    leaves no process, mount or file behind."""

    def __init__(self, binaries: ContainerdBinaries, base: Path, sandbox_image: str,
                 runc: Path = RUNC, log_level: str = "info", log: Path | None = None,
                 cdi_spec_dirs: tuple[str, ...] | None = None, systemd_cgroup: bool = False,
                 hugetlb: bool = False) -> None:
        self.binaries = binaries
        self.systemd_cgroup = systemd_cgroup  # runc's systemd cgroup driver (SystemdCgroup = true)
        # CRI's hugepage limits reach the spec (containerd's disable_hugetlb_controller, on by default)
        self.hugetlb = hugetlb
        self.cdi_spec_dirs = cdi_spec_dirs  # None: CDI off
        self.paths = DaemonPaths(base, log or base / "containerd.log")
        self.sandbox_image = sandbox_image
        self.runc = runc
        self.log_level = log_level
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def version(self) -> str:
        return self.binaries.version

    @property
    def address(self) -> str:
        return str(self.paths.grpc_socket)

    def config(self) -> TomlTable:
        make = config_v2 if self.binaries.major == 1 else config_v3
        return make(self.paths, self.sandbox_image, self.runc, self.log_level, self.cdi_spec_dirs,
                    self.systemd_cgroup, self.hugetlb)

    def _env(self) -> dict[str, str]:
        # containerd finds its shim (containerd-shim-runc-v2) on PATH: put this version's first.
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTAINERD_")}
        env["PATH"] = f"{self.binaries.bindir}:/usr/sbin:/usr/bin:/sbin:/bin"
        return env

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Starts containerd and waits until CRI says the runtime is ready and NRI's socket is up.
        Returns the seconds that took."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"containerd {self.version} is already running (pid {self.process.pid})")
        for folder in (self.paths.nri_plugins, self.paths.nri_plugin_config, self.paths.cni / "bin",
                       self.paths.cni / "net.d"):
            folder.mkdir(parents=True, exist_ok=True)
        self.paths.config.write_text(to_toml(self.config()))
        # containerd leaves nri.sock behind when it stops; only a fresh one means NRI is listening.
        self.paths.nri_socket.unlink(missing_ok=True)
        began = time.monotonic()
        with self.paths.log.open("ab") as log:
            log.write(f"=== harness: starting containerd {self.version} ===\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [str(self.binaries.containerd), "--config", str(self.paths.config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self._env(),
                start_new_session=True,
            )
        self._wait_ready(began + timeout_s)
        return time.monotonic() - began

    def _wait_ready(self, deadline: float) -> None:
        client = None
        try:
            while True:
                if self.process is None or self.process.poll() is not None:
                    raise DaemonFailed(f"containerd {self.version} exited ({self.returncode()})\n{self.log_tail()}")
                if self.paths.grpc_socket.exists():
                    client = client or CriClient(self.address, timeout_s=1.0)
                    if self.paths.nri_socket.exists() and self._runtime_ready(client):
                        return
                if time.monotonic() > deadline:
                    raise DaemonFailed(f"containerd {self.version} not ready in time\n{self.log_tail()}")
                time.sleep(0.05)
        finally:
            if client is not None:
                client.close()

    @staticmethod
    def _runtime_ready(client: CriClient) -> bool:
        try:
            conditions = client.status().status.conditions
        except grpc.RpcError:
            return False
        return any(c.type == "RuntimeReady" and c.status for c in conditions)

    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> float:
        """SIGTERM, then SIGKILL after `timeout_s`. Containers keep running in their shims."""
        began = time.monotonic()
        if self.process is None or self.process.poll() is not None:
            return 0.0
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        return time.monotonic() - began

    def restart(self) -> float:
        self.stop()
        return self.start()

    def cri(self) -> CriClient:
        return CriClient(self.address)

    def log_text(self) -> str:
        return self.paths.log.read_text(errors="replace") if self.paths.log.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def cleanup(self) -> list[str]:
        """Stops the daemon, then removes what a crashed test may have left: runc containers,
        shims, mounts, and the whole folder. Returns what could not be removed."""
        self.stop()
        problems = self._delete_runc_containers()
        problems += self._kill_shims()
        problems += _unmount_under(self.paths.base)
        shutil.rmtree(self.paths.base, ignore_errors=True)
        if self.paths.base.exists():
            problems.append(f"{self.paths.base} could not be removed")
        return problems

    def _delete_runc_containers(self) -> list[str]:
        problems = []
        roots = [p for p in self.paths.runc_root.glob("*") if p.is_dir()] if self.paths.runc_root.is_dir() else []
        for root in roots:
            for container in (p.name for p in root.iterdir() if p.is_dir()):
                done = subprocess.run([str(self.runc), "--root", str(root), "delete", "--force", container],
                                      capture_output=True, text=True, timeout=30, check=False)
                if done.returncode != 0:
                    problems.append(f"runc delete {container}: {done.stderr.strip()}")
        return problems

    def _kill_shims(self) -> list[str]:
        """Shims of this daemon name its socket on their command line; only those are signalled."""
        problems = []
        needle = self.address.encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmdline and needle in cmdline:
                try:
                    os.kill(int(proc.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass
                except OSError as exc:
                    problems.append(f"kill shim {proc.name}: {exc}")
        return problems


def _unmount_under(base: Path) -> list[str]:
    """Lazily unmounts every mount point below `base`, deepest first (rootfs overlays, shm)."""
    prefix = str(base.resolve()) + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            points.append(point)
    problems = []
    for point in sorted(points, key=len, reverse=True):
        done = subprocess.run(["umount", "--lazy", point], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            problems.append(f"umount {point}: {done.stderr.strip()}")
    return problems
