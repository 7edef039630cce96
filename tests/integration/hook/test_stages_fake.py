"""The hook's stages end to end on fake cgroup trees, in process: placement and pinning,
shared-pool moves, refusals that leave everything as it was, rollback when a write or the save
fails, garbage collection of dead containers, and precreate's placement claimed at createRuntime."""

from __future__ import annotations

import json
import os
import stat

import pytest

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.hook.machine import Machine
from nri_numa.hook.daemon_cache import DaemonCache
from nri_numa.hook.oci import parse_state
from nri_numa.hook.shared_ledger import PENDING_GRACE_S
from nri_numa.topology.cpulist import parse_list
from nri_numa.hook.stages import HookEnv, HookError, create_runtime, poststop, precreate
from nri_numa.state.checkpoint import CheckpointError, CheckpointStore, machine_fingerprint
from nri_numa.topology.synthetic import preset_topology
from tests.integration.hook.fake_host import FakeHost, oci_state, write_bundle

CONFIG = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,48",
          "topologyManagerPolicy": "single-numa-node"}
TOPOLOGY = preset_topology("intel-2s-ht")  # 96 CPUs, 2 nodes
PODMAN_ID = "5aa3cb4ef5e5" + "0" * 52


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
def host(request, tmp_path) -> FakeHost:
    return FakeHost(tmp_path / "host", request.param, TOPOLOGY.online_cpus)


@pytest.fixture
def clock() -> Clock:
    return Clock()


# Every stage test runs as a hook process runs it, and as the hook daemon does, keeping its
# ledger and cgroups between runs (nri_numa.hook.daemon_cache): the two must behave alike.
@pytest.fixture(params=[False, True], ids=["process", "daemon"])
def env(request, tmp_path, host, clock) -> HookEnv:
    ctx = EngineContext.build(TOPOLOGY, config_from_mapping(CONFIG))
    fingerprint = machine_fingerprint(TOPOLOGY)
    machine = Machine(TOPOLOGY, ctx, fingerprint)
    return HookEnv(machine, CheckpointStore(tmp_path / "state", fingerprint), host.fs, 2.0, clock,
                   cache=DaemonCache() if request.param else None)


def create(env: HookEnv, host: FakeHost, cid: str, pid: int, cpus: int = 0, **annotations) -> str:
    bundle = write_bundle(host.base, cid, cpus, annotations)
    host.start(pid, f"/pods/{cid}")
    state = parse_state(oci_state(cid, pid, bundle, **annotations))
    return create_runtime(env, state, json.loads((bundle / "config.json").read_text()))


def stop(env: HookEnv, host: FakeHost, cid: str, pid: int) -> str:
    host.stop(pid)
    return poststop(env, parse_state(oci_state(cid, None, host.base / "bundles" / cid)))


def checkpoint(env: HookEnv) -> dict:
    return env.store.load()


def test_an_exclusive_container_is_pinned_and_released(env, host):
    done = create(env, host, "x1", 1001, cpus=2)
    cpus = host.cpus("/pods/x1")
    assert len(cpus) == 2 and not cpus & {0, 48} and f"cpus {min(cpus)}" in done
    numa = {c.id: c.numa for c in TOPOLOGY.cpus}
    assert host.mems("/pods/x1") == {numa[c] for c in cpus}
    saved = checkpoint(env)
    assert saved["processes"]["x1"]["pid"] == 1001
    assert stat.S_IMODE(os.stat(env.store.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(env.store.dir).st_mode) == 0o700
    assert stop(env, host, "x1", 1001) == "released container x1"
    assert checkpoint(env)["processes"] == {}
    again = poststop(env, parse_state(oci_state("x1", None, host.base)))
    assert again == "container x1: nothing held"


def test_shared_containers_follow_the_pool(env, host):
    create(env, host, "s1", 1001)
    assert host.cpus("/pods/s1") == TOPOLOGY.online_cpus
    create(env, host, "x1", 1002, cpus=4)
    exclusive = host.cpus("/pods/x1")
    assert host.cpus("/pods/s1") == TOPOLOGY.online_cpus - exclusive
    create(env, host, "s2", 1003)
    assert host.cpus("/pods/s2") == host.cpus("/pods/s1")
    stop(env, host, "x1", 1002)
    assert host.cpus("/pods/s1") == host.cpus("/pods/s2") == TOPOLOGY.online_cpus


def test_a_refusal_changes_nothing(env, host):
    create(env, host, "x1", 1001, cpus=2)
    before = env.store.path.read_bytes()
    with pytest.raises(HookError, match="TopologyAffinityError") as refused:
        create(env, host, "big", 1002, cpus=60)  # no node has 60 free CPUs
    assert "\n" not in str(refused.value)
    assert env.store.path.read_bytes() == before
    assert host.cpus("/pods/big") == TOPOLOGY.online_cpus  # untouched


def test_devices_cannot_be_added_at_create_runtime(env, host):
    with pytest.raises(HookError, match="createRuntime hook cannot add"):
        create(env, host, "g", 1001, cpus=1, **{"numa.nri.io/devices": "nvidia.com/gpu=1"})
    assert not env.store.path.exists()


def test_a_pod_sandbox_is_left_alone(env, host):
    done = create(env, host, "sb", 1001, cpus=1, **{"io.kubernetes.cri.container-type": "sandbox"})
    assert "pod sandbox" in done and host.cpus("/pods/sb") == TOPOLOGY.online_cpus
    assert not env.store.path.exists()


def test_a_failed_move_puts_everything_back(env, host):
    create(env, host, "s1", 1001)
    create(env, host, "s2", 1002)
    before = env.store.path.read_bytes()
    # s2's cpuset.cpus becomes a symlink: the hook refuses to write through it.
    target = host.dir("/pods/s2") / "cpuset.cpus"
    target.unlink()
    target.symlink_to(host.dir("/pods/s2") / "cpuset.mems")
    with pytest.raises(HookError, match="cannot move container s2 off CPUs"):
        create(env, host, "x1", 1003, cpus=2)
    assert host.cpus("/pods/s1") == TOPOLOGY.online_cpus  # moved, then put back
    assert env.store.path.read_bytes() == before


def test_a_failed_save_puts_the_moves_back(env, host, monkeypatch):
    create(env, host, "s1", 1001)
    before = env.store.path.read_bytes()

    def full_disk(payload):
        raise CheckpointError(f"cannot write {env.store.path}: No space left on device")

    monkeypatch.setattr(env.store, "save", full_disk)
    with pytest.raises(HookError, match="cannot save the state, nothing changed: .*No space"):
        create(env, host, "x1", 1002, cpus=2)
    assert host.cpus("/pods/s1") == TOPOLOGY.online_cpus
    assert env.store.path.read_bytes() == before


def test_dead_containers_are_collected(env, host):
    create(env, host, "x1", 1001, cpus=46)  # node 0 has 46 unreserved CPUs: all of them
    node0 = host.cpus("/pods/x1")
    create(env, host, "x2", 1002, cpus=46)  # all of node 1
    with pytest.raises(HookError, match="TopologyAffinityError"):
        create(env, host, "x3", 1003, cpus=46)
    host.stop(1001)  # exits without a poststop (crun, a failed podman create, a crash)
    create(env, host, "x3", 1004, cpus=46)
    assert host.cpus("/pods/x3") == node0
    assert "x1" not in checkpoint(env)["processes"]


def test_a_reused_pid_does_not_keep_a_dead_container(env, host):
    create(env, host, "x1", 1001, cpus=46)
    host.stop(1001)
    host.start(1001, "/pods/other", start_time=999_999)  # same pid, another process
    create(env, host, "x2", 1002, cpus=46)
    create(env, host, "x3", 1003, cpus=46)  # x1's node is free again
    assert set(checkpoint(env)["processes"]) == {"x2", "x3"}


def test_running_twice_keeps_the_placement(env, host):
    create(env, host, "x1", 1001, cpus=2)
    cpus = host.cpus("/pods/x1")
    state = parse_state(oci_state("x1", 1001, host.base / "bundles" / "x1"))
    spec = json.loads((host.base / "bundles" / "x1" / "config.json").read_text())
    assert create_runtime(env, state, spec).startswith("kept container x1")
    assert host.cpus("/pods/x1") == cpus
    host.start(2002, "/pods/x1-again")
    with pytest.raises(HookError, match="already placed for running process 1001"):
        create_runtime(env, parse_state(oci_state("x1", 2002, host.base)), spec)


def test_the_plugins_state_folder_is_refused(env, host):
    env.store.save({"ledger": {"version": 1}, "records": {"pods": [], "containers": []}})
    with pytest.raises(HookError, match="NRI plugin"):
        create(env, host, "x1", 1001, cpus=1)


# --- precreate -----------------------------------------------------------------------------


def podman_spec(cpus: int, hooks: bool = True, **annotations: str) -> dict:
    claim = {"path": "/usr/local/bin/nri-numa", "args": ["nri-numa", "hook", "createRuntime"]}
    return {"process": {"env": ["PATH=/bin"]},
            "hooks": {"createRuntime": [claim]} if hooks else {},
            "annotations": {"numa.nri.io/hook": "true", **annotations},
            "linux": {"cgroupsPath": f"/libpod_parent/libpod-{PODMAN_ID}",
                      "resources": {"cpu": {"quota": cpus * 100_000, "period": 100_000},
                                    "memory": {"limit": 1 << 26}}}}


def test_precreate_places_in_the_spec_and_create_runtime_claims_it(env, host):
    create(env, host, "s1", 1001)
    spec, done = precreate(env, podman_spec(2))
    assert "precreate placed container" in done
    cpus = spec["linux"]["resources"]["cpu"]["cpus"]
    assert checkpoint(env)["processes"][PODMAN_ID]["pid"] is None
    shared_after = host.cpus("/pods/s1")
    assert not shared_after & set(map(int, cpus.replace("-", ",").split(",")))
    # runc writes the spec's cpuset; then the createRuntime hook claims the entry.
    host.start(1002, f"/libpod_parent/libpod-{PODMAN_ID}")
    state = parse_state(oci_state(PODMAN_ID, 1002, host.base, **{"numa.nri.io/hook": "true"}))
    assert create_runtime(env, state, spec).startswith(f"claimed container {PODMAN_ID}")
    claimed = host.cpus(f"/libpod_parent/libpod-{PODMAN_ID}")
    assert claimed and not claimed & shared_after
    assert checkpoint(env)["processes"][PODMAN_ID]["pid"] == 1002


def test_precreate_needs_the_claiming_hook(env, host):
    with pytest.raises(HookError, match="no `nri-numa hook createRuntime` hook"):
        precreate(env, podman_spec(1, hooks=False))


def podman_spec_for(cid: str, cpus: int) -> dict:
    spec = podman_spec(cpus)
    spec["linux"]["cgroupsPath"] = f"/libpod_parent/libpod-{cid}"
    return spec


def test_an_unclaimed_precreate_placement_expires(env, host, clock):
    first, second, third = ("1" * 64, "2" * 64, "3" * 64)
    precreate(env, podman_spec_for(first, 46))  # all of node 0
    precreate(env, podman_spec_for(second, 46))  # all of node 1
    with pytest.raises(HookError, match="TopologyAffinityError"):
        precreate(env, podman_spec_for(third, 46))
    clock.now += PENDING_GRACE_S / 2
    host.start(1002, f"/libpod_parent/libpod-{second}")
    create_runtime(env, parse_state(oci_state(second, 1002, host.base)), podman_spec_for(second, 46))
    clock.now += PENDING_GRACE_S / 2 + 1  # the first was never created; the second was claimed
    spec, _ = precreate(env, podman_spec_for(third, 46))
    assert set(checkpoint(env)["processes"]) == {second, third}


def test_precreate_refuses_what_does_not_fit(env, host):
    with pytest.raises(HookError, match="TopologyAffinityError"):
        precreate(env, podman_spec(60))
    assert not env.store.path.exists()


def test_precreate_gives_gpus_and_create_runtime_keeps_them(tmp_path, clock):
    dgx = preset_topology("dgx-h100")
    host = FakeHost(tmp_path / "dgx", 1, dgx.online_cpus)
    config = config_from_mapping({**CONFIG, "reservedSystemCPUs": "0"})
    fingerprint = machine_fingerprint(dgx)
    env = HookEnv(Machine(dgx, EngineContext.build(dgx, config), fingerprint),
                  CheckpointStore(tmp_path / "state", fingerprint), host.fs, 2.0, clock)
    asked = {"numa.nri.io/devices": "nvidia.com/gpu=2"}
    spec, done = precreate(env, podman_spec(4, **asked))
    gpus = [g for g in dgx.gpus if f"/dev/nvidia{g.minor}" in
            {d["path"] for d in spec["linux"]["devices"]}]
    assert len(gpus) == 2 and "nvidia.com/gpu" in done
    [visible] = [e for e in spec["process"]["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert set(visible.split("=", 1)[1].split(",")) == {g.uuid for g in gpus}
    nodes = {g.numa_node for g in gpus}
    cpu = spec["linux"]["resources"]["cpu"]
    assert {c.numa for c in dgx.cpus if c.id in parse_list(cpu["cpus"])} == nodes
    assert "mems" not in cpu  # no Memory Manager: memory nodes left alone, as the kubelet does
    host.start(1001, f"/libpod_parent/libpod-{PODMAN_ID}")
    state = parse_state(oci_state(PODMAN_ID, 1001, host.base, **asked))
    assert create_runtime(env, state, spec).startswith("claimed")  # no device refusal here
    assert host.mems(f"/libpod_parent/libpod-{PODMAN_ID}") == nodes
