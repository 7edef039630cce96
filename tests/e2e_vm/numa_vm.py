"""A real multi-NUMA Linux machine for the tests: a QEMU guest (TCG) whose NUMA nodes, CPUs, SMT
siblings, distances, memory, huge pages and PCI devices follow a layout file (tests/e2e_vm/layout.py),
booted from the image scripts/vm-deps builds (Debian 12, systemd on cgroup v2, containerd 1.7.24
and 2.1.9, runc, Python 3.11 with nri-numa's dependencies).

    numa-vm up DIR --layout FILE    boot it; DIR holds its disks, logs and ssh settings
    numa-vm exec DIR -- CMD...      run CMD in the guest as root (in /opt/nri-numa/src, the
                                    checkout's copy, with nri-numa on PATH); CMD's output and status
    numa-vm down DIR                stop it and remove its disks (the logs stay)

The guest runs the checkout as it is: `up` copies nri_numa/, tests/, hooks/, packaging/ and
pyproject.toml onto a small second disk that the guest mounts at /opt/nri-numa/src. It has no
network: its NICs are QEMU user networking with restrict=on, and the one way in is ssh forwarded
from 127.0.0.1.

Standard library only (scripts/numa-vm runs it with Debian's python3 when there is no .venv)."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.e2e_vm.layout import (MANAGEMENT_MAC, Layout, LayoutError, load_layout, qemu_pci_args,
                                 qemu_topology_args, resolve_path)

REPO = Path(__file__).resolve().parents[2]
VM_DEPS = REPO / "scripts" / "vm-deps"
CACHE = Path(os.environ.get("NRI_NUMA_VM_CACHE", "/var/cache/nri-numa/numa-vm"))
QEMU = "qemu-system-x86_64"
GUEST_SRC = "/opt/nri-numa/src"
SRC_DISK_LABEL = "nri-numa-src"  # scripts/vm-deps's /etc/fstab mounts it at GUEST_SRC
SRC_DISK_SIZE = "256M"
NVME_DISK_BYTES = 64 << 20
SOURCES = ("nri_numa", "tests", "hooks", "packaging", "pyproject.toml")
BOOT_TIMEOUT_S = float(os.environ.get("NRI_NUMA_VM_BOOT_TIMEOUT", "240"))
STOP_TIMEOUT_S = 10.0
# TSC stays the clocksource under TCG with a Skylake CPU model (with -cpu max Go binaries crawl on
# hpet); tsc=reliable keeps the watchdog from dropping it when the host is busy.
KERNEL_ARGS = ("console=ttyS0 root=/dev/vda rw systemd.unified_cgroup_hierarchy=1 tsc=reliable "
               "mitigations=off quiet loglevel=3 systemd.show_status=0")


class VmError(RuntimeError):
    """What went wrong, in one line (plus a log tail where one helps)."""


def log(message: str) -> None:
    print(f"numa-vm: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class VmDir:
    """The files of one guest, all in the folder given to `up`."""

    path: Path

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def pid_file(self) -> Path:
        return self.path / "qemu.pid"

    @property
    def console(self) -> Path:
        return self.path / "console.log"

    @property
    def ready(self) -> Path:
        return self.path / "ready"

    @property
    def disks(self) -> list[Path]:
        return [self / "root.qcow2", self / "src.img", *sorted(self.path.glob("nvme-*.img"))]

    def pid(self) -> int | None:
        """QEMU's pid when it is still this folder's QEMU (its command line names the folder)."""
        try:
            pid = int(self.pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if QEMU.encode() in cmdline and str(self.path).encode() in cmdline else None

    def ssh_command(self) -> list[str]:
        try:
            port = int((self / "ssh-port").read_text())
        except (OSError, ValueError):
            raise VmError(f"{self.path} holds no guest: run `numa-vm up {self.path} --layout FILE` first") from None
        return ["ssh", "-q", "-p", str(port), "-i", str(self / "id_ed25519"),
                "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "HostKeyAlias=numa-vm",
                "-o", f"UserKnownHostsFile={self / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes",
                "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=8",
                "-o", "LogLevel=ERROR", "root@127.0.0.1"]


def remote_command(argv: Sequence[str]) -> str:
    """The one string ssh hands the guest's shell: CMD's words quoted, run in the checkout's copy."""
    return f"cd {GUEST_SRC} && exec {shlex.join(argv)}"


def current_image() -> Path:
    """The image scripts/vm-deps built (it builds one when there is none or its inputs changed)."""
    done = subprocess.run([str(VM_DEPS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        last_error = CACHE / "last-error"
        why = last_error.read_text().strip() if last_error.is_file() else done.stderr.strip()[-400:]
        raise VmError(f"scripts/vm-deps could not provide the guest image: {why}")
    image = (CACHE / "current").resolve()
    if not (image / ".complete").is_file():
        raise VmError(f"scripts/vm-deps succeeded but {image} is not a complete image")
    return image


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stage_sources(vm: VmDir) -> Path:
    """nri_numa/, tests/ and pyproject.toml of the working tree as they are (caches left out),
    made into an ext4 image without mounting anything."""
    tree = vm / "src-tree"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", ".hypothesis", "*.pyc")
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(source, tree / name)
    disk = vm / "src.img"
    disk.unlink(missing_ok=True)
    run_checked(["mkfs.ext4", "-q", "-F", "-L", SRC_DISK_LABEL, "-d", str(tree), str(disk), SRC_DISK_SIZE],
                "mkfs.ext4 of the source disk")
    shutil.rmtree(tree)
    return disk


def refresh_sources(vm: VmDir) -> None:
    """The working tree's sources copied into a running guest again (tar over ssh)."""
    tar = subprocess.Popen(["tar", "c", "--exclude=__pycache__", *SOURCES], cwd=REPO, stdout=subprocess.PIPE)
    done = subprocess.run([*vm.ssh_command(), remote_command(["tar", "x", "-C", GUEST_SRC])],
                          stdin=tar.stdout, capture_output=True, text=True, timeout=300, check=False)
    tar.wait()
    if done.returncode != 0 or tar.returncode != 0:
        raise VmError(f"copying the sources into the guest failed: {done.stderr.strip()[-400:]}")


def run_checked(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise VmError(f"{what} failed ({done.returncode}): {done.stderr.strip()[-400:]}")


def qemu_command(layout: Layout, vm: VmDir, image: Path, port: int) -> list[str]:
    nvme_disks = {d.index: vm / f"nvme-{d.index}.img" for d in layout.pci if d.kind == "nvme"}
    return [
        QEMU, "-name", "numa-vm", "-machine", "q35", "-accel", "tcg,thread=multi",
        "-cpu", "Skylake-Server", *qemu_topology_args(layout),
        "-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"), "-append", KERNEL_ARGS,
        # On the root bus, named: QEMU would otherwise put them behind a node's expander bridge.
        "-drive", f"file={vm / 'root.qcow2'},if=none,id=root,format=qcow2,cache=unsafe",
        "-device", "virtio-blk-pci,drive=root,bus=pcie.0",
        "-drive", f"file={vm / 'src.img'},if=none,id=src,format=raw,cache=unsafe",
        "-device", "virtio-blk-pci,drive=src,bus=pcie.0",
        "-netdev", f"user,id=management,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22",
        "-device", f"virtio-net-pci,netdev=management,mac={MANAGEMENT_MAC},bus=pcie.0",
        *qemu_pci_args(layout, nvme_disks),
        "-display", "none", "-vga", "none", "-monitor", "none", "-serial", f"file:{vm.console}", "-no-reboot",
    ]


def console_tail(vm: VmDir, lines: int = 25) -> str:
    try:
        text = vm.console.read_text(errors="replace")
    except OSError:
        return "(no console output)"
    return "\n".join(text.splitlines()[-lines:])


def guest_run(vm: VmDir, argv: Sequence[str], timeout_s: float = 60, stdin: str | None = None,
              check: bool = True) -> subprocess.CompletedProcess[str]:
    """CMD in the guest, its output captured; VmError when ssh fails or (with check) CMD does."""
    try:
        done = subprocess.run([*vm.ssh_command(), remote_command(argv)], input=stdin, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise VmError(f"{shlex.join(argv)} did not finish in the guest within {timeout_s:g} s") from None
    if check and done.returncode != 0:
        raise VmError(f"{shlex.join(argv)} failed in the guest ({done.returncode}): "
                      f"{(done.stderr or done.stdout).strip()[-600:]}")
    return done


def wait_for_ssh(vm: VmDir, deadline: float) -> None:
    while True:
        pid = vm.pid()
        if pid is None:
            said = [line for line in (vm / "qemu.log").read_text(errors="replace").splitlines()
                    if "TCG doesn't support requested feature" not in line]  # -cpu Skylake-Server's
            raise VmError(f"QEMU exited during boot; {vm / 'qemu.log'}: {' '.join(said)[-400:]}\n"
                          f"console:\n{console_tail(vm)}")
        probe = subprocess.run([*vm.ssh_command(), "true"], capture_output=True, timeout=60, check=False)
        if probe.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise VmError(f"no ssh answer from the guest within {BOOT_TIMEOUT_S:g} s; console:\n{console_tail(vm)}")
        time.sleep(1)


def set_hugepages(vm: VmDir, layout: Layout) -> None:
    """Each node's 2 MiB pool, written to the node's own sysfs file and read back."""
    wanted = {n.id: n.hugepages_2m for n in layout.nodes if n.hugepages_2m}
    if not wanted:
        return
    files = {node: f"/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/nr_hugepages" for node in wanted}
    script = "; ".join(f"echo {count} > {files[node]}" for node, count in wanted.items())
    script += "; cat " + " ".join(files[node] for node in wanted)
    got = guest_run(vm, ["sh", "-c", script]).stdout.split()
    short = [f"node {node}: {have} of {count}" for (node, count), have in zip(wanted.items(), got)
             if int(have) != count]
    if short:
        raise VmError(f"the guest could not reserve every 2 MiB huge page asked for ({'; '.join(short)})")


def check_guest(vm: VmDir, layout: Layout) -> None:
    done = guest_run(vm, ["sh", "-c", f"test -f {GUEST_SRC}/nri_numa/__init__.py && "
                                      "ls -d /sys/devices/system/node/node* | wc -l && nproc --all && "
                                      "stat -fc %T /sys/fs/cgroup"])
    nodes, cpus, cgroup_fs = done.stdout.split()
    if int(nodes) != len(layout.nodes) or int(cpus) != layout.cpu_count:
        raise VmError(f"the guest has {nodes} nodes and {cpus} CPUs, the layout {len(layout.nodes)} and "
                      f"{layout.cpu_count}")
    if cgroup_fs != "cgroup2fs":
        raise VmError(f"the guest's /sys/fs/cgroup is {cgroup_fs}, not the cgroup v2 unified hierarchy")


def up(vm: VmDir, layout_file: str) -> Layout:
    began = time.monotonic()
    layout = load_layout(layout_file)
    if shutil.which(QEMU) is None:
        raise VmError(f"{QEMU} is not installed (Debian package qemu-system-x86; scripts/vm-deps installs it)")
    if vm.pid() is not None:
        raise VmError(f"a guest already runs in {vm.path} (numa-vm down {vm.path} first)")
    try:
        return boot(vm, layout, layout_file, began)
    except BaseException:  # a failure or Ctrl-C: nothing of this guest stays running
        down(vm)
        raise


def boot(vm: VmDir, layout: Layout, layout_file: str, began: float) -> Layout:
    vm.path.mkdir(parents=True, exist_ok=True)
    vm.ready.unlink(missing_ok=True)
    image = current_image()
    (vm / "image").write_text(f"{image}\n")
    (vm / "layout.json").write_text(resolve_path(layout_file).read_text())
    # The guest's keys travel with DIR: a newer image may replace this one while the guest runs.
    (vm / "id_ed25519").unlink(missing_ok=True)
    shutil.copy2(image / "id_ed25519", vm / "id_ed25519")
    os.chmod(vm / "id_ed25519", 0o600)
    host_key = (image / "host_key.pub").read_text().split()
    (vm / "known_hosts").write_text(f"numa-vm {host_key[0]} {host_key[1]}\n")
    (vm / "root.qcow2").unlink(missing_ok=True)
    run_checked(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(image / "root.img"),
                 str(vm / "root.qcow2")], "qemu-img create of the root overlay")
    stage_sources(vm)
    for device in layout.pci:
        if device.kind == "nvme":
            with open(vm / f"nvme-{device.index}.img", "wb") as disk:
                disk.truncate(NVME_DISK_BYTES)
    port = free_port()
    (vm / "ssh-port").write_text(f"{port}\n")
    vm.console.unlink(missing_ok=True)
    command = qemu_command(layout, vm, image, port)
    (vm / "qemu-command").write_text(shlex.join(command) + "\n")
    with open(vm / "qemu.log", "wb") as qemu_log:
        # Its own session: QEMU outlives this command and a Ctrl-C in the terminal; down stops it.
        qemu = subprocess.Popen(["nice", "-n", os.environ.get("NRI_NUMA_VM_NICE", "10"), *command],
                                stdin=subprocess.DEVNULL, stdout=qemu_log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    vm.pid_file.write_text(f"{qemu.pid}\n")
    log(f"booting {layout.name}: {layout.summary()} (console: {vm.console})")
    time.sleep(0.5)  # `nice` has become QEMU by now (the pid check reads its command line)
    wait_for_ssh(vm, began + BOOT_TIMEOUT_S)
    set_hugepages(vm, layout)
    check_guest(vm, layout)
    vm.ready.write_text(f"{time.monotonic() - began:.1f}\n")
    log(f"up in {time.monotonic() - began:.1f} s; ssh on 127.0.0.1:{port}; try: "
        f"scripts/numa-vm exec {vm.path} -- nri-numa topology")
    return layout


def down(vm: VmDir) -> bool:
    """Stops this folder's QEMU (SIGTERM, then SIGKILL) and removes its disks. True when one ran."""
    pid = vm.pid()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while vm.pid() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        if vm.pid() is not None:
            os.kill(pid, signal.SIGKILL)
            while vm.pid() is not None:
                time.sleep(0.1)
    for path in vm.disks:
        path.unlink(missing_ok=True)
    shutil.rmtree(vm / "src-tree", ignore_errors=True)
    for name in ("qemu.pid", "ready", "ssh-port"):
        (vm / name).unlink(missing_ok=True)
    return pid is not None


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="numa-vm", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser("up", help="boot a guest with the layout's NUMA topology")
    up_parser.add_argument("dir", type=Path)
    up_parser.add_argument("--layout", required=True,
                           help="a layout JSON file, or the name of one in tests/e2e_vm/layouts (snc2, cxl)")
    exec_parser = commands.add_parser("exec", help="run a command in the guest as root")
    exec_parser.add_argument("dir", type=Path)
    exec_parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    down_parser = commands.add_parser("down", help="stop the guest and remove its disks")
    down_parser.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    vm = VmDir(args.dir.resolve())
    try:
        if args.command == "up":
            if os.geteuid() != 0:
                raise VmError("must run as root (the image lives in /var/cache/nri-numa; scripts/vm-deps builds it)")
            signal.signal(signal.SIGTERM, _raise_interrupt)
            up(vm, args.layout)
            return 0
        if args.command == "exec":
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            if not cmd:
                raise VmError("exec needs a command: numa-vm exec DIR -- CMD [ARG...]")
            if vm.pid() is None:
                raise VmError(f"no guest runs in {vm.path} (numa-vm up {vm.path} --layout FILE)")
            return subprocess.run([*vm.ssh_command(), remote_command(cmd)], check=False).returncode
        log(f"stopped the guest in {vm.path}" if down(vm) else f"no guest was running in {vm.path}")
        return 0
    except LayoutError as exc:
        for line in str(exc).splitlines():
            log(f"layout {line}")
        return 2
    except VmError as exc:
        log(str(exc))
        return 1
    except KeyboardInterrupt:
        log("interrupted; the guest was stopped")
        return 130


if __name__ == "__main__":
    sys.exit(main())
