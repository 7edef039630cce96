"""The nri-numa image (packaging/Containerfile) as scripts/image builds it — a Debian 12 base made
with mmdebstrap, the wheels installed without network — run by real podman with no network:
its version, the topology it reads from the host's /sys, the runtime dependencies the agent and
the extender import (as the extender Deployment's user, on a read-only root), and no apt sources
left in it. Root only (mmdebstrap --mode=root, podman's default storage); the build is cached by
scripts/image (a few seconds when the image is up to date, about a minute cold on 2 CPUs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import nri_numa
from nri_numa.topology.cpulist import parse_list

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PODMAN = "/usr/bin/podman"
IMAGE = f"localhost/nri-numa:{nri_numa.__version__}"
BUILD_TIMEOUT_S = 900
RUN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if os.geteuid() != 0:
        pytest.skip("the image tests need root: scripts/image runs mmdebstrap --mode=root")
    for tool, where in ((PODMAN, "scripts/e2e-deps"), ("mmdebstrap", "scripts/vm-deps")):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is missing ({where} installs it from Debian)")
    # No RLIMIT_NOFILE/NPROC defaults: machines without CAP_SYS_RESOURCE refuse podman's.
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


@pytest.fixture(scope="module")
def image(podman_env: dict[str, str]) -> str:
    """scripts/image's image, built now unless it is up to date."""
    done = subprocess.run([str(REPO / "scripts" / "image")], capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, env=podman_env)
    assert done.returncode == 0, f"scripts/image failed:\n{done.stderr[-4000:]}"
    assert f"image: {IMAGE}" in done.stdout, done.stdout
    return IMAGE


def podman_run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PODMAN, "run", "--rm", "--network=none", *args], capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, env=env)


def test_version(image: str, podman_env: dict[str, str]) -> None:
    done = podman_run(podman_env, image, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"nri-numa {nri_numa.__version__}"


def test_topology_reads_this_machine(image: str, podman_env: dict[str, str]) -> None:
    """`nri-numa topology` in the image, on the host's /sys (read-only), sees this machine's CPUs,
    NUMA nodes and memory exactly as the checkout's nri-numa does on the host."""
    online = parse_list(Path("/sys/devices/system/cpu/online").read_text().strip())
    table = podman_run(podman_env, "-v", "/sys:/sys:ro", image, "topology", "--no-nvml")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[:3] == ["node", "cpus", "#cpus"]
    assert sum(int(row.split()[2]) for row in rows) == len(online)

    inside = podman_run(podman_env, "-v", "/sys:/sys:ro", image, "topology", "--json", "--no-nvml")
    assert inside.returncode == 0, inside.stderr
    host = subprocess.run([str(REPO / ".venv" / "bin" / "nri-numa"), "topology", "--json", "--no-nvml"],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=True)
    seen, expected = json.loads(inside.stdout), json.loads(host.stdout)
    assert {cpu["id"] for cpu in seen["cpus"] if cpu["online"]} == set(online)
    assert seen["cpus"] == expected["cpus"]
    assert ([(n["id"], n["cpus"], n["memory_bytes"], n["distances"]) for n in seen["numa_nodes"]]
            == [(n["id"], n["cpus"], n["memory_bytes"], n["distances"]) for n in expected["numa_nodes"]])


def test_runtime_dependencies_as_the_extender_runs(image: str, podman_env: dict[str, str]) -> None:
    """As scheduler-extender.yaml runs it (user 65534, read-only root): every runtime dependency
    imports — grpcio's extension included, which needs Debian's libstdc++6 — and the extender and
    the hook client start."""
    modules = ("grpc", "google.protobuf", "yaml", "pyroute2", "pynvml", "kubernetes.client",
               "kubernetes.config", "kubernetes.watch", "nri_numa.cluster", "nri_numa.extender",
               "nri_numa.podresources", "nri_numa.hook.client")
    user = ("--user", "65534:65534", "--read-only")
    imported = podman_run(podman_env, *user, "--entrypoint", "/opt/nri-numa/bin/python", image, "-c",
                          f"import importlib; [importlib.import_module(m) for m in {modules!r}]; "
                          "import os; print(os.getuid())")
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "65534"
    for command in ("scheduler-extender", "hook"):
        done = podman_run(podman_env, *user, image, command, "--help")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"usage: nri-numa {command}"), done.stdout


def test_image_names_no_mirror_and_keeps_no_apt_state(image: str, podman_env: dict[str, str]) -> None:
    """No apt sources (they would name the mirror), package lists, apt caches, man pages, locales
    or docs besides the licences."""
    done = podman_run(podman_env, "--entrypoint", "/bin/sh", image, "-c",
                      "find /etc/apt/sources.list /etc/apt/sources.list.d /var/lib/apt/lists "
                      "/var/cache/apt /usr/share/man /usr/share/locale /usr/share/doc -type f "
                      "! -name lock ! -name copyright 2>/dev/null; true")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], done.stdout
