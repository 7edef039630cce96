from nri_numa.topology.render import render_table, render_tree
from tests.unit.test_model import small_topology


def test_tree_nests_package_node_l3_core_and_places_devices():
    text = render_tree(small_topology())
    lines = text.splitlines()
    assert lines[0] == "Machine (2 packages, 3 NUMA nodes, 3 CPUs, 64.0 GiB)"
    i_pkg, i_node = lines.index("  Package 0 (CPUs 0-1)"), lines.index(
        "    NUMANode 0 (16.0 GiB; hugepages 2M 6/8; isolated CPUs 1)")
    assert i_pkg < i_node
    assert "      L3 0 (CPUs 0-1)" in lines
    assert "        Core 0: PU 0, 1" in lines
    gpu_line = next(line for line in lines if "GPU 0" in line)
    assert gpu_line.startswith("      PCI 0000:1b:00.0 3D [10de:2330] GPU 0 H100 GPU-1")
    assert lines.index(gpu_line) > i_node
    assert "  NUMANode 4 (32.0 GiB; no CPUs)" in lines  # CPU-less node at machine level
    assert "  Offline CPUs: 3" in lines
    assert "  Isolated CPUs (isolcpus): 1" in lines
    assert "  warning: something odd" in lines


def test_table_has_one_row_per_node():
    lines = render_table(small_topology()).splitlines()
    assert lines[0].split() == ["node", "cpus", "#cpus", "isolated", "memory", "hugepages",
                                "free/total", "gpus", "nics", "pci", "distances"]
    rows = [line.split() for line in lines[1:4]]
    assert [r[0] for r in rows] == ["0", "1", "4"]
    assert rows[0][:5] == ["0", "0-1", "2", "1", "16.0"]  # CPU 1 is isolated
    assert "2M" in rows[0] and "6/8" in rows[0]
    assert rows[2][1] == "-"  # no CPUs on node 4
    assert lines[-1] == "warning: something odd"
