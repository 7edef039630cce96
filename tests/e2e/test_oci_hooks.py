"""The OCI hook end to end: real runc bundles on a busybox rootfs with `nri-numa hook` in their
config.json, and real podman with a --hooks-dir, on real cgroups.

What is checked is what the kernel applied: `Cpus_allowed_list`/`Mems_allowed_list` inside the
container, and the container cgroup's cpuset files against the hook's ledger. Everything lives
under one temp folder and one cgroup parent of its own, removed afterwards (another suite may run
containerd beside this one). Root only; skipped, with the reason, without root, runc, busybox or
(for its tests) podman.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from nri_numa.hook.client import SOCKET_ENV, SOCKET_NAME
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint
from nri_numa.topology.cpulist import format_list, parse_list
from nri_numa.topology.model import Topology
from tests.e2e.harness.cgroups import (CgroupLayout, detect_layout, parse_status_allowed,
                                       process_cgroup, read_cpuset, remove_cgroups)
from tests.e2e.harness.image import rootfs_layer
from tests.e2e.harness.runtimes import RUNC, RuntimesUnavailable, find_busybox

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PYTHON_CLIENT = REPO / "nri_numa" / "hook" / "client.py"
PODMAN = Path("/usr/bin/podman")
HOOK_TIMEOUT_S = 20  # in config.json / hooks.d: 20 hooks at once share this machine's CPUs
HOOK_OWN_TIMEOUT_S = 15
STATUS = ["/bin/sh", "-c", "grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status"]
MIB = 1 << 20


@dataclass
class Lab:
    base: Path
    rootfs: Path
    state: Path
    config: Path
    topology: Topology
    topology_file: Path
    layout: CgroupLayout
    parent: str  # the cgroup parent of every container here
    hook: Path  # the nri-numa executable

    @property
    def reserved(self) -> frozenset[int]:
        return frozenset({min(self.topology.online_cpus)})

    @property
    def allocatable(self) -> frozenset[int]:
        return self.topology.online_cpus - self.reserved

    def hook_args(self, stage: str) -> list[str]:
        """As the shipped files run the hook: the Python client by path, from the interpreter
        nri-numa is installed in, with -I -S (no daemon here: it runs the hook in process)."""
        return [self.hook_path, "-I", "-S", str(PYTHON_CLIENT), stage, "--config", str(self.config),
                "--state-dir", str(self.state), "--topology", str(self.topology_file),
                "--timeout", str(HOOK_OWN_TIMEOUT_S)]

    def hook_env(self, shipped: list[str]) -> list[str]:
        """A shipped hook's environment with the socket in this lab's state folder."""
        return [f"{SOCKET_ENV}={self.state / SOCKET_NAME}" if e.startswith(f"{SOCKET_ENV}=")
                else e for e in shipped]

    @property
    def hook_path(self) -> str:
        return str(self.hook.with_name("python3"))

    def ledger(self) -> dict:
        payload = CheckpointStore(self.state, machine_fingerprint(self.topology)).load()
        return payload or {"records": {"containers": []}, "ledger": None, "processes": {}}


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("the OCI hook e2e tests need root: they run runc and write cgroups")
    if not os.access(RUNC, os.X_OK):
        pytest.skip(f"{RUNC} is missing (Debian package runc; scripts/e2e-deps installs it)")
    try:
        busybox = find_busybox()
    except RuntimesUnavailable as e:
        pytest.skip(str(e))
    hook = Path(sys.executable).with_name("nri-numa")
    if not os.access(hook, os.X_OK):
        pytest.skip(f"{hook} is missing: install the package (scripts/setup)")
    layout = detect_layout()
    # Short and under /tmp: podman keeps unix sockets under its run root (108-byte limit).
    base = Path(tempfile.mkdtemp(prefix="nri-numa-hook-e2e-", dir="/tmp"))
    parent = f"/nri-numa-hook-e2e-{uuid.uuid4().hex[:8]}"
    try:
        rootfs = base / "rootfs"
        rootfs.mkdir()
        with tarfile.open(fileobj=io.BytesIO(rootfs_layer(busybox))) as tar:
            tar.extractall(rootfs, filter="tar")
        topology_json = subprocess.run([str(hook), "topology", "--json", "--no-nvml"],
                                       capture_output=True, text=True, check=True).stdout
        topology = Topology.from_json(topology_json)
        if len(topology.online_cpus) < 2:
            pytest.skip("the OCI hook e2e tests need two CPUs: one reserved, one to pin")
        (base / "topology.json").write_text(topology_json)
        config = base / "config.json"
        config.write_text(json.dumps({"cpuManagerPolicy": "static",
                                      "reservedSystemCPUs": str(min(topology.online_cpus)),
                                      "topologyManagerPolicy": "single-numa-node"}))
        yield Lab(base, rootfs, base / "state", config, topology, base / "topology.json",
                  layout, parent, hook)
    finally:
        _cleanup(base, layout, parent)


def _cleanup(base: Path, layout: CgroupLayout, parent: str) -> None:
    runc_root = base / "runc"
    if runc_root.is_dir():
        for entry in runc_root.iterdir():
            subprocess.run([str(RUNC), "--root", str(runc_root), "delete", "--force", entry.name],
                           capture_output=True, timeout=30)
    if (base / "podman").is_dir() and PODMAN.exists():
        subprocess.run([*_podman_base(base), "rm", "--all", "--force"], capture_output=True,
                       timeout=60, env=_podman_env(base))
    for mount in reversed(_mounts_under(base)):
        subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)
    remove_cgroups(layout, [parent])
    shutil.rmtree(base, ignore_errors=True)


def _mounts_under(base: Path) -> list[str]:
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point == str(base) or point.startswith(str(base) + "/"):
            mounts.append(point)
    return mounts


# --- runc ----------------------------------------------------------------------------------


def bundle(lab: Lab, name: str, cpus: int, args: list[str]) -> Path:
    """A bundle made from hooks/runc-config.example.json, pointed at this lab."""
    spec = json.loads((REPO / "hooks" / "runc-config.example.json").read_text())
    spec["root"] = {"path": str(lab.rootfs), "readonly": True}
    spec["process"]["args"] = args
    spec["linux"]["cgroupsPath"] = f"{lab.parent}/{name}"
    resources = spec["linux"]["resources"]
    if cpus:
        resources["cpu"] = {"quota": cpus * 100_000, "period": 100_000}
    else:  # BestEffort: the shared pool
        del resources["cpu"], resources["memory"]
    for stage, [hook] in spec["hooks"].items():
        hook.update(path=lab.hook_path, args=lab.hook_args(stage), env=lab.hook_env(hook["env"]),
                    timeout=HOOK_TIMEOUT_S)
    folder = lab.base / "bundles" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(spec))
    return folder


def runc(lab: Lab, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(RUNC), "--root", str(lab.base / "runc"), *args],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def run_status(lab: Lab, name: str, cpus: int) -> subprocess.CompletedProcess:
    """`runc run` in the foreground: the container prints its allowed lists and exits."""
    return runc(lab, "run", "--bundle", str(bundle(lab, name, cpus, STATUS)), name)


def running_pid(lab: Lab, name: str) -> int:
    state = json.loads(runc(lab, "state", name).stdout)
    return state["pid"]


def test_an_exclusive_cpu_is_all_the_container_sees_and_poststop_frees_it(lab):
    first = run_status(lab, "first", cpus=1)
    assert first.returncode == 0, first.stderr
    seen = parse_status_allowed(first.stdout)
    assert len(seen.cpu_ids) == 1 and seen.cpu_ids <= lab.allocatable
    numa = {c.id: c.numa for c in lab.topology.cpus}
    assert parse_list(seen.mems) == {numa[c] for c in seen.cpu_ids}
    assert lab.ledger()["records"]["containers"] == []  # poststop released it
    # The same request on the same (empty) ledger: the engine answers the same CPU, which it
    # could not give if the first container still held it on a machine with one to give.
    second = run_status(lab, "second", cpus=1)
    assert second.returncode == 0, second.stderr
    assert parse_status_allowed(second.stdout).cpu_ids == seen.cpu_ids


def test_a_container_without_requests_runs_on_the_shared_pool(lab):
    done = run_status(lab, "besteffort", cpus=0)
    assert done.returncode == 0, done.stderr
    assert parse_status_allowed(done.stdout).cpu_ids == lab.topology.online_cpus


def test_twenty_concurrent_containers_never_share_an_exclusive_cpu(lab):
    names = [f"ex{i}" for i in range(10)] + [f"sh{i}" for i in range(10)]
    for name in names:
        bundle(lab, name, 1 if name.startswith("ex") else 0, ["/bin/sleep", "600"])

    def start(name: str) -> subprocess.CompletedProcess:
        # A detached container keeps runc's stdio: files, not pipes that would never close.
        log = lab.base / "bundles" / name / "runc.err"
        with open(log, "w") as err:
            done = subprocess.run([str(RUNC), "--root", str(lab.base / "runc"), "run",
                                   "--detach", "--bundle", str(lab.base / "bundles" / name), name],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=err, timeout=120)
        return subprocess.CompletedProcess(done.args, done.returncode, "", log.read_text())

    try:
        with ThreadPoolExecutor(len(names)) as pool:
            results = dict(zip(names, pool.map(start, names)))
        started = {n for n, r in results.items() if r.returncode == 0}
        refused = set(names) - started
        assert {n for n in names if n.startswith("sh")} <= started, \
            {n: results[n].stderr for n in refused}
        assert len(started) == 10 + min(10, len(lab.allocatable))
        for name in refused:
            assert "nri-numa hook createRuntime:" in results[name].stderr
            assert "exclusive CPUs" in results[name].stderr, results[name].stderr

        payload = lab.ledger()
        records = {r["id"]: r for r in payload["records"]["containers"]}
        assert set(records) == started
        pool_cpus = parse_list(payload["ledger"]["allocations"]["shared"])
        held: set[int] = set()
        for name in started:
            pid = running_pid(lab, name)
            cgroup = process_cgroup(pid, lab.layout)
            assert cgroup == f"{lab.parent}/{name}"
            on_disk = read_cpuset(lab.layout, cgroup)
            kernel = parse_status_allowed(Path(f"/proc/{pid}/status").read_text())
            if records[name]["exclusive"]:
                cpus = parse_list(records[name]["cpus"])
                assert on_disk.cpu_ids == on_disk.effective_cpu_ids == cpus and len(cpus) == 1
                assert not cpus & held, f"{name} got CPU {format_list(cpus)} twice"
                held |= cpus
            else:
                assert on_disk.cpu_ids == pool_cpus, name
            assert kernel.cpu_ids == on_disk.cpu_ids
        assert not held & pool_cpus and held | pool_cpus == lab.topology.online_cpus
    finally:
        for name in names:
            runc(lab, "delete", "--force", name)
    payload = lab.ledger()
    assert payload["records"]["containers"] == []
    assert parse_list(payload["ledger"]["allocations"]["shared"]) == lab.topology.online_cpus


def test_a_request_that_cannot_fit_fails_the_create_with_our_reason(lab):
    too_many = len(lab.allocatable) + 1
    done = run_status(lab, "too-big", cpus=too_many)
    assert done.returncode != 0
    assert "error running hook" in done.stderr
    assert "nri-numa hook createRuntime:" in done.stderr
    assert f"asked {too_many} exclusive CPUs" in done.stderr, done.stderr
    assert "too-big" not in runc(lab, "list").stdout
    assert lab.ledger()["records"]["containers"] == []


# --- podman --------------------------------------------------------------------------------


def _podman_base(base: Path) -> list[str]:
    root = base / "podman"
    return [str(PODMAN), "--root", str(root / "root"), "--runroot", str(root / "run"),
            "--tmpdir", str(root / "tmp"), "--storage-driver", "vfs",
            "--cgroup-manager", "cgroupfs", "--events-backend", "file",
            "--runtime", str(RUNC)]


def _podman_env(base: Path) -> dict[str, str]:
    # No RLIMIT_NOFILE default: machines without CAP_SYS_RESOURCE refuse podman's 1048576.
    conf = base / "podman" / "containers.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def hooks_dir(lab: Lab, name: str, files: tuple[str, ...]) -> Path:
    """The shipped hooks.d files, pointed at this lab."""
    folder = lab.base / name
    folder.mkdir(exist_ok=True)
    for file in files:
        data = json.loads((REPO / "hooks" / file).read_text())
        data["hook"].update(path=lab.hook_path, args=lab.hook_args(data["stages"][0]),
                            env=lab.hook_env(data["hook"]["env"]), timeout=HOOK_TIMEOUT_S)
        (folder / file).write_text(json.dumps(data))
    return folder


def podman(lab: Lab, hooks: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*_podman_base(lab.base), "--hooks-dir", str(hooks), *args],
                          capture_output=True, text=True, timeout=180, env=_podman_env(lab.base),
                          stdin=subprocess.DEVNULL)


def podman_run(lab: Lab, hooks: Path, name: str, annotated: bool) -> subprocess.CompletedProcess:
    # --rootfs is a flag: the rootfs is the first positional argument, every option before it.
    annotation = ["--annotation", "numa.nri.io/hook=true"] if annotated else []
    return podman(lab, hooks, "run", "--name", name, "--network", "none", "--cpus", "1",
                  "--memory", "64m", "--cgroup-parent", f"{lab.parent}/podman", *annotation,
                  "--rootfs", str(lab.rootfs), *STATUS)


def oci_config(lab: Lab, hooks: Path, name: str) -> dict:
    path = podman(lab, hooks, "inspect", "--format", "{{.OCIConfigPath}}", name).stdout.strip()
    return json.loads(Path(path).read_text())


def wait_for_release(lab: Lab, seconds: float = 20) -> list:
    """podman runs poststop itself, from its clean-up after the container exited."""
    deadline = time.monotonic() + seconds
    while (held := lab.ledger()["records"]["containers"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return held


@pytest.fixture
def podman_ready(lab):
    if not PODMAN.exists():
        pytest.skip(f"{PODMAN} is missing (Debian package podman; scripts/e2e-deps installs it)")
    yield
    subprocess.run([*_podman_base(lab.base), "rm", "--all", "--force"], capture_output=True,
                   timeout=60, env=_podman_env(lab.base))


def test_podman_runs_the_hook_only_for_the_annotated_container(lab, podman_ready):
    hooks = hooks_dir(lab, "hooks.d-runtime",
                      ("nri-numa-createruntime.json", "nri-numa-poststop.json"))
    pinned = podman_run(lab, hooks, "pinned", annotated=True)
    assert pinned.returncode == 0, pinned.stderr
    cpus = parse_status_allowed(pinned.stdout).cpu_ids
    assert len(cpus) == 1 and cpus <= lab.allocatable
    # createRuntime wrote the cgroup, not the spec: podman --cpus sets no cpuset of its own.
    assert "cpus" not in oci_config(lab, hooks, "pinned")["linux"]["resources"].get("cpu", {})
    assert wait_for_release(lab) == []
    free = podman_run(lab, hooks, "free", annotated=False)
    assert free.returncode == 0, free.stderr
    assert parse_status_allowed(free.stdout).cpu_ids == lab.topology.online_cpus


def test_podman_precreate_puts_the_placement_in_the_spec(lab, podman_ready):
    hooks = hooks_dir(lab, "hooks.d-all", ("nri-numa-precreate.json",
                                           "nri-numa-createruntime.json",
                                           "nri-numa-poststop.json"))
    done = podman_run(lab, hooks, "placed", annotated=True)
    assert done.returncode == 0, done.stderr
    cpus = parse_status_allowed(done.stdout).cpu_ids
    assert len(cpus) == 1 and cpus <= lab.allocatable
    spec_cpu = oci_config(lab, hooks, "placed")["linux"]["resources"]["cpu"]
    assert parse_list(spec_cpu["cpus"]) == cpus
    assert "mems" not in spec_cpu  # no Memory Manager: memory nodes left alone, as the kubelet does
    assert wait_for_release(lab) == []
