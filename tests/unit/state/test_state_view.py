"""`nri-numa state` over a state folder the real plugin wrote (NumaPlugin with a CheckpointStore,
fed protobuf requests as containerd sends them) and cgroup trees written in tmp as the kernel
lays them out: cgroup v1 with the cgroupfs driver, v2 with the systemd driver. The state folder
is never changed by reading it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from nri_numa.cli import build_parser, main
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.hook.cgroup import DEFAULT_CGROUP_ROOT
from nri_numa.hook.shared_ledger import ProcessRecord, SharedLedger
from nri_numa.nri import translate
from nri_numa.nri.daemon import DEFAULT_STATE_DIR
from nri_numa.runtime import DeviceLocator
from nri_numa.runtime.cpuset_cgroups import systemd_slice_path
from nri_numa.state.checkpoint import FILE_NAME, CheckpointStore, machine_fingerprint
from nri_numa.topology.cpulist import format_list
from nri_numa.topology.model import Topology
from nri_numa.views.state_view import StateViewError, build_view, read_checkpoint
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import CONFIG, GPU_ON_NODE_1, create, machine, new_plugin
from tests.tmpfs import fast_tmp

GIB = 1 << 30
MEMORY = {"memoryManagerPolicy": "Static",
          "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]}


@pytest.fixture
def base(tmp_path: Path):
    with fast_tmp(tmp_path) as folder:
        yield folder


class Placed:
    """Three containers placed by the plugin: BestEffort `be/app` (shared), Guaranteed `g/app`
    (2 exclusive CPUs, 1Gi, and the GPU on node 1), and the pods they belong to."""

    def __init__(self, base: Path, driver: str = "cgroupfs") -> None:
        self.state_dir = base / "state"
        plugin = new_plugin(self.state_dir, **MEMORY)
        self.be_pod = msg.pod("be", "besteffort", driver=driver)
        self.g_pod = msg.pod("g", driver=driver)
        self.be = msg.container(self.be_pod, "app")
        self.g = msg.guaranteed(self.g_pod, "app", cpus=2, memory=GIB,
                                env=[f"NVIDIA_VISIBLE_DEVICES={GPU_ON_NODE_1}"])
        create(plugin, self.be_pod, self.be)
        reply = create(plugin, self.g_pod, self.g)
        self.exclusive = reply.adjust.linux.resources.cpu.cpus
        self.mems = reply.adjust.linux.resources.cpu.mems
        self.shared = plugin.ledger.allocations.shared


def write_cgroup(folder: Path, cpus: str, mems: str, version: int = 1) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpuset.cpus").write_text(cpus + "\n")
    (folder / "cpuset.mems").write_text(mems + "\n")
    if version == 2:
        (folder / "cpuset.cpus.effective").write_text(cpus or "0-7")
        (folder / "cpuset.mems.effective").write_text(mems or "0-1")


def v1_tree(base: Path, placed: Placed, *, g_cpus: str | None = None,
            be_cpus: str | None = None, g_mems: str | None = None) -> Path:
    """cgroup v1 as containerd's cgroupfs driver lays it out: <parent>/<container id>."""
    root = base / "cgroup"
    write_cgroup(root / "cpuset", "0-7", "0-1")
    (root / "memory").mkdir()
    pool = ",".join(str(c) for c in sorted(placed.shared))
    write_cgroup(root / "cpuset" / placed.be_pod.linux.cgroup_parent.lstrip("/") / placed.be.id,
                 be_cpus or pool, "0-1")
    write_cgroup(root / "cpuset" / placed.g_pod.linux.cgroup_parent.lstrip("/") / placed.g.id,
                 g_cpus or placed.exclusive, g_mems or placed.mems)
    return root


def run_state(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["state", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# --- what is shown ----------------------------------------------------------------------------


def test_agreeing_cgroups_show_every_container_and_exit_0(base, capsys):
    placed = Placed(base)
    root = v1_tree(base, placed)
    before = snapshot(placed.state_dir)
    code, out, err = run_state(capsys, "--state-dir", str(placed.state_dir),
                               "--cgroup-root", str(root))
    assert (code, err) == (0, "")
    assert snapshot(placed.state_dir) == before  # nothing written, renamed or removed
    lines = out.splitlines()
    assert f"shared pool: {format_list(placed.shared)}" in lines
    assert f"cgroups: v1 at {root / 'cpuset'}" in lines
    [g_row] = [line for line in lines if line.startswith("default/g ")]
    assert g_row.split()[:5] == ["default/g", "app", placed.g.id[:12], "Guaranteed", "exclusive"]
    assert placed.exclusive in g_row.split()
    assert f"memory 1Gi on {placed.mems}" in g_row
    assert "nvidia.com/gpu on 1" in g_row  # the runtime gave it; NUMA node 1 holds it
    assert g_row.endswith("ok")
    [be_row] = [line for line in lines if line.startswith("default/be ")]
    assert be_row.split()[3:6] == ["BestEffort", "shared", format_list(placed.shared)]
    assert lines[-1] == "no drift"


def test_json_carries_the_same_facts(base, capsys):
    placed = Placed(base)
    root = v1_tree(base, placed)
    code, out, _ = run_state(capsys, "--state-dir", str(placed.state_dir), "--cgroup-root",
                             str(root), "--json")
    data = json.loads(out)
    assert code == 0 and data["drifted"] == 0 and data["kind"] == "nri"
    by_pod = {c["pod"]["name"]: c for c in data["containers"]}
    g = by_pod["g"]
    assert (g["exclusive"], g["cpus"], g["mems"], g["qos"]) == (True, placed.exclusive,
                                                                placed.mems, "Guaranteed")
    assert g["memory"] == [{"resource": "memory", "numa_nodes": [int(placed.mems)],
                            "bytes": GIB}]
    assert (g["devices"], g["device_numa_nodes"]) == ({}, {"nvidia.com/gpu": [1]})
    assert g["cgroup"]["path"] == f"{placed.g_pod.linux.cgroup_parent}/{placed.g.id}"
    assert by_pod["be"]["mems"] is None and by_pod["be"]["memory"] == []
    node = int(placed.mems)
    held = {(m["node"], m["resource"]): m["held"] for m in data["node_memory"]}
    assert held[(node, "memory")] == GIB


# --- drift ------------------------------------------------------------------------------------


def test_an_exclusive_container_moved_behind_the_plugins_back_is_drift(base, capsys):
    placed = Placed(base)
    root = v1_tree(base, placed, g_cpus="0-7")
    code, out, _ = run_state(capsys, "--state-dir", str(placed.state_dir),
                             "--cgroup-root", str(root))
    assert code == 3
    assert (f"DRIFT default/g app ({placed.g.id[:12]}) at {placed.g_pod.linux.cgroup_parent}/"
            f"{placed.g.id}: cpuset.cpus is 0-7, ledger says {placed.exclusive}") in out
    assert out.splitlines()[-1] == "1 of 2 containers drifted"


def test_a_shared_container_left_on_the_old_pool_is_drift(base, capsys):
    placed = Placed(base)
    root = v1_tree(base, placed, be_cpus="0-7")
    code, out, _ = run_state(capsys, "--state-dir", str(placed.state_dir),
                             "--cgroup-root", str(root), "--json")
    data = json.loads(out)
    assert code == 3 and data["drifted"] == 1
    [be] = [c for c in data["containers"] if c["drift"]]
    assert be["pod"]["name"] == "be"
    assert be["drift"] == [f"cpuset.cpus is 0-7, ledger says {format_list(placed.shared)}"]


def test_memory_nodes_that_differ_are_drift(base, capsys):
    placed = Placed(base)
    root = v1_tree(base, placed, g_mems="0-1")
    code, out, _ = run_state(capsys, "--state-dir", str(placed.state_dir),
                             "--cgroup-root", str(root))
    assert code == 3 and f"cpuset.mems is 0-1, ledger says {placed.mems}" in out


def test_a_container_without_a_cgroup_is_shown_as_such_not_as_drift(base, capsys):
    placed = Placed(base)
    root = v1_tree(base, placed)
    cgroup = root / "cpuset" / placed.g_pod.linux.cgroup_parent.lstrip("/") / placed.g.id
    for f in cgroup.iterdir():
        f.unlink()
    cgroup.rmdir()
    code, out, _ = run_state(capsys, "--state-dir", str(placed.state_dir),
                             "--cgroup-root", str(root))
    assert code == 0
    [g_row] = [line for line in out.splitlines() if line.startswith("default/g ")]
    assert g_row.endswith("not found")


def test_systemd_driver_on_cgroup_v2_is_found_and_read(base, capsys):
    placed = Placed(base, driver="systemd")
    root = base / "unified"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for pod, container, cpus, mems in ((placed.g_pod, placed.g, placed.exclusive, placed.mems),
                                       (placed.be_pod, placed.be, "", "")):
        slices = systemd_slice_path(pod.linux.cgroup_parent)
        # cpuset.cpus never written (empty): cgroup v2 then gives the parent's CPUs.
        write_cgroup(root / slices.lstrip("/") / f"cri-containerd-{container.id}.scope", cpus,
                     mems, version=2)
    code, out, _ = run_state(capsys, "--state-dir", str(placed.state_dir),
                             "--cgroup-root", str(root), "--json")
    data = json.loads(out)
    by_pod = {c["pod"]["name"]: c for c in data["containers"]}
    assert by_pod["g"]["cgroup"]["path"] == (
        f"/kubepods.slice/kubepods-podg.slice/cri-containerd-{placed.g.id}.scope".replace(
            "podg", "poduid_g"))
    assert by_pod["g"]["drift"] == []
    # The BestEffort container's empty cpuset.cpus means every CPU (its effective set), and
    # the pool is smaller: drift.
    assert by_pod["be"]["cgroup"]["cpus"] == "0-7"
    assert code == 3 and by_pod["be"]["drift"]


def test_slice_paths_nest_as_systemd_nests_them():
    assert systemd_slice_path("kubepods-besteffort-pod1_2.slice") == (
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1_2.slice")
    assert systemd_slice_path("kubepods.slice") == "/kubepods.slice"


def test_a_cgroup_elsewhere_in_the_tree_is_found_by_its_name(base, capsys):
    placed = Placed(base)
    root = v1_tree(base, placed)
    cpuset = root / "cpuset"
    moved = cpuset / "runtime" / "nested" / f"crio-{placed.g.id}"
    moved.parent.mkdir(parents=True)
    (cpuset / placed.g_pod.linux.cgroup_parent.lstrip("/") / placed.g.id).rename(moved)
    code, out, _ = run_state(capsys, "--state-dir", str(placed.state_dir),
                             "--cgroup-root", str(root), "--json")
    [g] = [c for c in json.loads(out)["containers"] if c["pod"]["name"] == "g"]
    assert code == 0 and g["cgroup"]["path"] == f"/runtime/nested/crio-{placed.g.id}"


def test_no_cpuset_hierarchy_is_a_note_not_drift(base, capsys):
    placed = Placed(base)
    code, out, _ = run_state(capsys, "--state-dir", str(placed.state_dir),
                             "--cgroup-root", str(base / "nothing"))
    assert code == 0
    assert f"note: no cpuset cgroup hierarchy under {base / 'nothing'}: cgroups not checked" in out


# --- reserved CPUs and the machine ------------------------------------------------------------


def test_config_gives_the_reserved_cpus_and_checks_the_machine(base, capsys):
    placed = Placed(base)
    root = v1_tree(base, placed)
    config = base / "config.yaml"
    config.write_text(json.dumps({**CONFIG, **MEMORY}))
    topology = base / "topology.json"
    topology.write_text(machine().to_json())
    code, out, _ = run_state(capsys, "--state-dir", str(placed.state_dir), "--cgroup-root",
                             str(root), "--config", str(config), "--topology", str(topology))
    assert code == 0 and "reserved CPUs: 0" in out.splitlines()

    other = Topology.from_json(machine().to_json())
    other = Topology(cpus=other.cpus[:4], numa_nodes=other.numa_nodes[:1])
    topology.write_text(other.to_json())
    code, out, err = run_state(capsys, "--state-dir", str(placed.state_dir), "--config",
                               str(config), "--topology", str(topology))
    assert code == 1 and out == ""
    assert err == (f"nri-numa: error: {placed.state_dir / FILE_NAME} was written on another "
                   "machine (or before its CPUs changed): nri-numa sets it aside when it next "
                   "starts\n")


def test_the_plugins_checkpoint_records_the_reserved_cpus_and_policies(base, capsys):
    placed = Placed(base)
    _, out, _ = run_state(capsys, "--state-dir", str(placed.state_dir), "--cgroup-root",
                          str(v1_tree(base, placed)))
    assert "reserved CPUs: 0" in out.splitlines()
    assert "policies: topology single-numa-node, CPU static, memory Static" in out.splitlines()


# --- bad state: one line, exit 1, nothing changed ---------------------------------------------


def test_a_missing_state_folder_is_one_clear_line(base, capsys):
    code, out, err = run_state(capsys, "--state-dir", str(base / "none"))
    assert (code, out) == (1, "")
    assert err == (f"nri-numa: error: no checkpoint at {base / 'none' / FILE_NAME} "
                   f"({base / 'none'} does not exist): nri-numa has placed nothing there yet, "
                   "or give the --state-dir it runs with\n")


@pytest.mark.parametrize("damage, why", [
    (lambda raw: raw[: len(raw) // 2], ": not JSON (truncated or garbled?)"),
    (lambda raw: raw.replace(b'"name":"app"', b'"name":"other"', 1), "checksum mismatch"),
    (lambda raw: b'{"format": "something-else"}', ": not an nri-numa checkpoint"),
    (lambda raw: raw.replace(b'"version":1', b'"version":7', 1), "checkpoint version 7"),
])
def test_an_untrusted_checkpoint_is_reported_and_left_where_it_is(base, capsys, damage, why):
    placed = Placed(base)
    path = placed.state_dir / FILE_NAME
    path.write_bytes(damage(path.read_bytes()))
    before = snapshot(placed.state_dir)
    code, out, err = run_state(capsys, "--state-dir", str(placed.state_dir))
    assert (code, out) == (1, "")
    assert err.startswith(f"nri-numa: error: {path}") and why in err and err.count("\n") == 1
    assert snapshot(placed.state_dir) == before  # not set aside, unlike the plugin would


def test_a_checkpoint_from_an_earlier_boot_is_reported(base):
    folder = base / "state"
    CheckpointStore(folder, "m", boot_id="an-earlier-boot").save({"ledger": {}, "records": {}})
    with pytest.raises(StateViewError, match="written before the machine last started"):
        read_checkpoint(folder, boot_id="this-boot")


def test_reading_does_not_wait_for_the_plugins_lock(base, capsys):
    placed = Placed(base)
    holder = CheckpointStore(placed.state_dir, machine_fingerprint(machine()))
    holder.lock()  # as the running plugin holds it
    try:
        began = time.monotonic()
        code, _, _ = run_state(capsys, "--state-dir", str(placed.state_dir), "--cgroup-root",
                               str(v1_tree(base, placed)))
        assert code == 0 and time.monotonic() - began < 5
    finally:
        holder.unlock()


# --- the OCI hook's ledger --------------------------------------------------------------------


def test_the_hooks_ledger_uses_the_cgroups_it_recorded(base, capsys):
    topology = machine()
    ctx = EngineContext.build(topology, config_from_mapping(CONFIG))
    ledger = SharedLedger(ctx, DeviceLocator(topology))
    pod = msg.pod("h")
    running, pending = msg.guaranteed(pod, "run", cpus=1), msg.guaranteed(pod, "wait", cpus=1)
    for c, cgroup in ((running, "/machine/one"), (pending, None)):
        ledger.admit(translate.runtime_container(c, translate.runtime_pod(pod)))
        pid = None if cgroup is None else 4242
        ledger.attach(c.id, ProcessRecord(pid, pid and 1, cgroup, time.time()))
    folder = base / "hook-state"
    CheckpointStore(folder, machine_fingerprint(topology)).save(ledger.to_payload())
    root = base / "cgroup"
    write_cgroup(root / "cpuset", "0-7", "0-1")
    placed_cpus = format_list(ledger.record(running.id).cpus)
    placed_mems = format_list(ledger.record(running.id).mems or frozenset())  # None: left alone
    write_cgroup(root / "cpuset" / "machine" / "one", placed_cpus, placed_mems)

    view = build_view(folder, read_checkpoint(folder), root)
    assert view.kind == "hook"
    by_name = {c.name: c for c in view.containers}
    assert by_name["run"].cgroup.path == "/machine/one" and not by_name["run"].drift
    assert by_name["wait"].cgroup.problem.startswith("pending")
    code, out, _ = run_state(capsys, "--state-dir", str(folder), "--cgroup-root", str(root))
    assert code == 0 and "OCI hook (nri-numa hook)" in out
    # The hook's checkpoint does not record its configuration.
    assert "reserved CPUs: not in the checkpoint (give --config to compute them)" in out


# --- the command line -------------------------------------------------------------------------


def test_defaults_are_the_plugins_state_folder_and_the_cgroup_mount():
    args = build_parser().parse_args(["state"])
    assert Path(args.state_dir) == Path(DEFAULT_STATE_DIR)
    assert Path(args.cgroup_root) == DEFAULT_CGROUP_ROOT
    assert (args.json, args.config, args.topology) == (False, None, None)
