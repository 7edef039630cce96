"""Runs in the numa-vm guest: the OCI hook as hooks/runc-config.example.json ships it (the fast
client by path under `python3 -I -S`, createRuntime and poststop) in runc bundles run with runc's
systemd cgroup driver (`runc --systemd-cgroup`, cgroupsPath `system.slice:nri-numa-hook-<run>:<name>`)
on cgroup v2; what each container got, as JSON on standard output.

    numa-vm exec DIR -- python3 -m tests.e2e_vm.guest_hook < plan.json

The plan: {"config": {KubeletConfiguration keys}, "containers": [{"name": "core", "cpus": 2}, ...]}
(cpus 0: no CPU request, the shared pool). Every container runs `sleep`, detached; it is read
back (its scope's cpuset files, /proc/self/status inside it through `runc exec`, `nri-numa state`
on the hook's state folder), then all are deleted, which runs poststop, and the state is read
again."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import traceback
import uuid
from pathlib import Path

from tests.e2e.harness.cgroups import detect_layout, parse_status_allowed, process_cgroup, read_cpuset
from tests.e2e.harness.image import rootfs_layer
from tests.e2e.harness.runtimes import RUNC, find_busybox

SRC = Path(__file__).resolve().parents[2]
EXAMPLE = SRC / "hooks" / "runc-config.example.json"
PYTHON_CLIENT = SRC / "nri_numa" / "hook" / "client.py"
PYTHON = "/usr/bin/python3"
HOOK_TIMEOUT_S = 60  # a TCG guest on a busy 2-CPU host
SLICE = "system.slice"


def runc(root: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RUNC), "--systemd-cgroup", "--root", str(root), *args],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False)


def run_detached(root: Path, bundle: Path, name: str) -> subprocess.CompletedProcess[str]:
    """`runc run --detach`: the container keeps runc's stdio, so files, never pipes that would
    not close while it runs."""
    log = bundle / "runc.log"
    with open(log, "w") as out:
        done = subprocess.run([str(RUNC), "--systemd-cgroup", "--root", str(root), "run", "--detach",
                               "--bundle", str(bundle), name], stdin=subprocess.DEVNULL, stdout=out,
                              stderr=out, timeout=180, check=False)
    return subprocess.CompletedProcess(done.args, done.returncode, "", log.read_text())


def hook_args(stage: str, config: Path, state: Path) -> list[str]:
    return [PYTHON, "-I", "-S", str(PYTHON_CLIENT), stage, "--config", str(config), "--state-dir", str(state),
            "--timeout", str(HOOK_TIMEOUT_S - 5)]


def write_bundle(base: Path, rootfs: Path, name: str, cpus: int, config: Path, state: Path, prefix: str) -> Path:
    spec = json.loads(EXAMPLE.read_text())
    spec["root"] = {"path": str(rootfs), "readonly": True}
    spec["process"]["args"] = ["/bin/sleep", "600"]
    spec["linux"]["cgroupsPath"] = f"{SLICE}:{prefix}:{name}"
    resources = spec["linux"]["resources"]
    if cpus:
        resources["cpu"] = {"quota": cpus * 100_000, "period": 100_000}
    else:
        del resources["cpu"], resources["memory"]
    for stage, [hook] in spec["hooks"].items():
        hook.update(path=PYTHON, args=hook_args(stage, config, state), timeout=HOOK_TIMEOUT_S,
                    env=[*hook["env"][:1], f"NRI_NUMA_HOOK_SOCKET={state}/hook.sock"])
    folder = base / "bundles" / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(spec))
    return folder


def state_of(state: Path) -> dict[str, object]:
    done = subprocess.run(["nri-numa", "state", "--state-dir", str(state), "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    return {"status": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-2000:]}


def unpack_busybox(rootfs: Path, busybox: Path) -> None:
    """A read-only root for the bundles: the e2e harness's busybox layer, unpacked."""
    rootfs.mkdir()
    with tarfile.open(fileobj=io.BytesIO(rootfs_layer(busybox))) as tar:
        # Our own layer; Debian 12's Python 3.11.2 predates extractall's filter argument.
        tar.extractall(rootfs, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))


def main() -> int:
    plan = json.load(sys.stdin)
    layout = detect_layout()
    base = Path(tempfile.mkdtemp(prefix="vm-hook-", dir="/tmp"))
    root, state, config, rootfs = base / "runc", base / "state", base / "config.json", base / "rootfs"
    # The scopes' names are this run's own: a container an interrupted run left behind keeps its scope.
    prefix = f"nri-numa-hook-{uuid.uuid4().hex[:8]}"
    answer: dict[str, object] = {"containers": {}, "scope_prefix": prefix}
    names: list[str] = []
    try:
        unpack_busybox(rootfs, find_busybox())
        config.write_text(json.dumps(plan["config"]))
        for container in plan["containers"]:
            name = container["name"]
            bundle = write_bundle(base, rootfs, name, container["cpus"], config, state, prefix)
            started = run_detached(root, bundle, name)
            got: dict[str, object] = {"created": started.returncode == 0, "stderr": started.stderr[-2000:]}
            answer["containers"][name] = got  # type: ignore[index]
            if started.returncode != 0:
                continue
            names.append(name)
            pid = json.loads(runc(root, "state", name).stdout)["pid"]
            cgroup = process_cgroup(pid, layout)
            cpuset = read_cpuset(layout, cgroup)
            inside = parse_status_allowed(runc(root, "exec", name, "cat", "/proc/self/status").stdout)
            got.update(cgroup=cgroup, cpus=cpuset.cpus, cpus_effective=cpuset.effective_cpus, mems=cpuset.mems,
                       mems_effective=cpuset.effective_mems, inside_cpus=inside.cpus, inside_mems=inside.mems)
        answer["cpus_effective_at_end"] = {
            name: read_cpuset(layout, answer["containers"][name]["cgroup"]).effective_cpus  # type: ignore[index]
            for name in names}
        answer["state"] = state_of(state)
        for name in names:
            runc(root, "kill", name, "KILL")
        for name in names:
            deleted = runc(root, "delete", "--force", name)
            if deleted.returncode != 0:
                answer.setdefault("delete_errors", []).append(deleted.stderr[-500:])  # type: ignore[union-attr]
        answer["state_after_delete"] = state_of(state)
    except Exception:  # noqa: BLE001 - the host test shows it
        answer["error"] = traceback.format_exc()
    finally:
        for name in names:
            runc(root, "delete", "--force", name)
        shutil.rmtree(base, ignore_errors=True)
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
