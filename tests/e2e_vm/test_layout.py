"""Layouts as data, without a guest: the shipped ones say what they promise, bad ones are refused
with one line per problem, and the QEMU options and guest command lines built from them."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.e2e_vm import guest_plan
from tests.e2e_vm.layout import LAYOUTS_DIR, LayoutError, load_layout, parse_layout, qemu_pci_args, qemu_topology_args
from tests.e2e_vm.numa_vm import main, remote_command

GOOD = {"sockets": 2,
        "nodes": [{"id": 0, "socket": 0, "cores": 2, "threads_per_core": 2, "memory_mib": 1024, "hugepages_2m": 32},
                  {"id": 1, "socket": 1, "cores": 2, "threads_per_core": 2, "memory_mib": 512},
                  {"id": 2, "socket": 1, "cores": 0, "memory_mib": 512}],
        "distances": [[10, 21, 31], [21, 10, 14], [31, 14, 10]],
        "pci": [{"kind": "nic", "node": 0}, {"kind": "nvme", "node": 2}]}


def problems(data: object) -> list[str]:
    with pytest.raises(LayoutError) as refused:
        parse_layout(data)
    return refused.value.problems


def test_snc2_is_two_sockets_of_two_nodes_with_smt_and_sub_numa_distances() -> None:
    layout = load_layout("snc2")
    assert layout.sockets == 2 and [n.socket for n in layout.nodes] == [0, 0, 1, 1]
    assert 8 <= layout.cpu_count <= 16 and layout.threads_per_core == 2
    assert {layout.distance(0, 1), layout.distance(2, 3)} == {11}
    assert {layout.distance(a, b) for a in (0, 1) for b in (2, 3)} == {21}
    assert {(d.kind, d.node) for d in layout.pci} == {("nic", 1), ("nvme", 3)}


def test_cxl_has_two_nodes_with_cpus_and_a_memory_only_node() -> None:
    layout = load_layout("cxl")
    assert [bool(n.cpus) for n in layout.nodes] == [True, True, False]


def test_every_shipped_layout_is_valid() -> None:
    for path in LAYOUTS_DIR.glob("*.json"):
        assert load_layout(path).nodes, path


def test_cpus_are_numbered_socket_by_socket_and_nodes_take_their_sockets_cores_in_order() -> None:
    layout = parse_layout(GOOD)
    assert [n.cpus for n in layout.nodes] == [(0, 1, 2, 3), (4, 5, 6, 7), ()]
    assert layout.node(0).siblings == [(0, 1), (2, 3)]
    args = qemu_topology_args(layout)
    assert args[:4] == ["-smp", "8,sockets=2,cores=2,threads=2", "-m", "2048M"]
    assert "node,nodeid=2,memdev=mem2" in args  # no cpus= for the memory-only node
    assert "dist,src=2,dst=0,val=31" in args


def test_devices_sit_behind_their_nodes_expander_bridge() -> None:
    args = qemu_pci_args(parse_layout(GOOD), {1: Path("/d/nvme-1.img")})
    bridges = [a for a in args if a.startswith("pxb-pcie")]
    assert [b.split("numa_node=")[1].split(",")[0] for b in bridges] == ["0", "2"]
    assert "nvme,bus=rp1,serial=nri-numa-1,drive=nvme1" in args
    assert any(a.startswith("user,id=nic0,restrict=on") for a in args)


def test_each_problem_is_one_line() -> None:
    bad = json.loads(json.dumps(GOOD))
    bad["nodes"][1]["threads_per_core"] = 1
    bad["nodes"][2]["id"] = 5
    bad["distances"][0][0] = 12
    bad["pci"].append({"kind": "gpu", "node": 0})
    found = problems(bad)
    assert found == [
        "nodes: ids must be 0..2, each once (got [0, 1, 5])",
        "nodes: every node with cores needs the same threads_per_core (QEMU has one thread count; got [1, 2])",
        "distances[0][0]: a node's distance to itself must be 10 (got 12)",
        "pci[1].node: must be one of the node ids [0, 1, 5] (got 2)",
        "pci[2].kind: must be one of nic, nvme (got \"gpu\")",
    ]


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d.update(sockets=0), "sockets: must be an integer >= 1 (got 0)"),
    (lambda d: d["nodes"][0].pop("memory_mib"), "nodes[0].memory_mib: missing"),
    (lambda d: d["nodes"][0].update(cores="2"), "nodes[0].cores: must be an integer >= 0 (got \"2\")"),
    (lambda d: d["nodes"][1].update(cores=1), "nodes: every socket needs the same number of cores"),
    (lambda d: d["nodes"][0].update(hugepages_2m=400), "nodes[0].hugepages_2m: 400 pages (800 MiB)"),
    (lambda d: d["nodes"][0].update(socket=2), "nodes[0].socket: 2 is not below sockets (2)"),
    (lambda d: d.update(distances=[[10, 21], [21, 10]]), "distances: must be a 3x3 matrix"),
    (lambda d: d["distances"][1].__setitem__(0, 255), "distances[1][0]: must be 11..254 (got 255)"),
    (lambda d: d["pci"][0].update(node=3), "pci[0].node: must be one of the node ids [0, 1, 2] (got 3)"),
])
def test_a_bad_value_is_named(change, expected: str) -> None:
    data = json.loads(json.dumps(GOOD))
    change(data)
    assert any(p.startswith(expected) for p in problems(data)), problems(data)


def test_not_an_object_and_no_nodes() -> None:
    assert problems([]) == ["must be a JSON object with sockets, nodes and distances"]
    assert problems({"sockets": 1, "nodes": []}) == ["nodes: must be a non-empty list of objects"]


def test_up_with_a_bad_layout_says_so_on_one_line_each_and_exits_2(tmp_path: Path, capsys, monkeypatch) -> None:
    layout = tmp_path / "bad.json"
    layout.write_text('{"sockets": 1, "nodes": [{"id": 0, "socket": 0, "cores": 1}], "distances": [[10]]}')
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert main(["up", str(tmp_path / "vm"), "--layout", str(layout)]) == 2
    assert capsys.readouterr().err == f"numa-vm: layout {layout}: nodes[0].memory_mib: missing\n"
    assert not (tmp_path / "vm" / "qemu.pid").exists()


def test_exec_quotes_every_word_for_the_guests_shell() -> None:
    command = remote_command(["echo", "a b", "c;d", "$HOME", "it's"])
    assert command.startswith("cd /opt/nri-numa/src && exec ")
    assert shlex.split(command.split("exec ", 1)[1]) == ["echo", "a b", "c;d", "$HOME", "it's"]


def test_up_where_a_guest_runs_refuses_and_leaves_that_guest_alone(tmp_path: Path, capsys, monkeypatch) -> None:
    stopped = []
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr("tests.e2e_vm.numa_vm.VmDir.pid", lambda self: 4242)
    monkeypatch.setattr("tests.e2e_vm.numa_vm.down", lambda vm: stopped.append(vm))
    assert main(["up", str(tmp_path), "--layout", "snc2"]) == 1
    assert "a guest already runs in" in capsys.readouterr().err
    assert stopped == []


def test_on_snc2_the_spread_pod_tells_distributing_from_packing() -> None:
    """The guest's distribute check holds only if the agent applied the option: on snc2 the
    packed algorithm would give the wide pod one whole socket, the distributed one two nodes of
    different sockets (its node order puts the socket with fewer free CPUs first)."""
    layout = load_layout("snc2")
    wanted = guest_plan.spread_cpus(layout)
    assert wanted == 4
    assert guest_plan.engine_choice(layout, wanted, distribute=False) == {4, 5, 6, 7}
    assert guest_plan.engine_choice(layout, wanted, distribute=True) == {2, 3, 4, 5}
