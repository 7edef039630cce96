"""Network links: netlink (and pyroute2's import) only when sysfs is not this namespace's."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nri_numa.topology import netdev

REPO = Path(__file__).resolve().parents[2]
LIVE_NICS = """
import json, sys
from pathlib import Path
from nri_numa.topology import netdev, pci
warnings = []
nics = netdev.read_nics(Path("/"), pci.read_pci_devices(Path("/"), warnings), warnings,
                        netlink=True)
print(json.dumps({"same": netdev.sysfs_is_this_namespace("/sys/class/net"),
                  "pyroute2": "pyroute2" in sys.modules,
                  "nics": sorted(n.name for n in nics), "warnings": warnings}))
"""

live_sysfs = pytest.mark.skipif(not os.path.isdir("/sys/class/net"), reason="no /sys/class/net")


def run_live(prefix: list[str]) -> dict:
    done = subprocess.run([*prefix, sys.executable, "-c", LIVE_NICS], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@live_sysfs
def test_this_namespace_sysfs_answers_without_pyroute2():
    seen = run_live([])
    assert seen["same"] is True
    assert seen["pyroute2"] is False
    # Netlink would have added nothing: every PCI link it knows is one sysfs already gave.
    warnings: list[str] = []
    from_netlink = netdev._netlink_pci_links(warnings)
    assert warnings == []
    assert set(from_netlink) <= set(seen["nics"])


@live_sysfs
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare for a network namespace of its own")
def test_another_namespace_asks_netlink():
    # A new network namespace keeps the sysfs mounted from ours: its links are not ours.
    seen = run_live(["unshare", "--net"])
    assert seen["same"] is False
    assert seen["pyroute2"] is True


def test_a_gathered_tree_is_not_this_namespace(tmp_path):
    net = tmp_path / "sys/class/net"
    (net / "lo").mkdir(parents=True)
    (net / "lo/ifindex").write_text("1\n")
    (net / "lo/address").write_text("00:00:00:00:00:00\n")
    # A tree holding only lo matches only a namespace whose one link is lo.
    expected = {name for _, name in socket.if_nameindex()} == {"lo"}
    assert netdev.sysfs_is_this_namespace(str(net)) is expected


def test_missing_folder_is_not_this_namespace(tmp_path):
    assert netdev.sysfs_is_this_namespace(str(tmp_path / "absent")) is False
