"""Where the real runtimes are: containerd 1.7.24 and 2.1.9 unpacked by scripts/e2e-deps, runc and
busybox-static installed from Debian 12. Finding them never installs anything by itself;
`ensure_runtimes` runs scripts/e2e-deps once when something is missing."""

from __future__ import annotations

import os
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

RUNTIME_VERSIONS = ("1.7.24", "2.1.9")
REPO = Path(__file__).resolve().parents[3]
DEPS_SCRIPT = REPO / "scripts" / "e2e-deps"
RUNC = Path("/usr/sbin/runc")
BUSYBOX_CANDIDATES = (Path("/bin/busybox"), Path("/usr/bin/busybox"))
CRI_SCHEMA_IN_PACKAGE = Path("usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto")
DEPS_TIMEOUT_S = 900


class RuntimesUnavailable(Exception):
    """The runtimes are not on disk and scripts/e2e-deps could not get them; str() says why."""


@dataclass(frozen=True)
class ContainerdBinaries:
    version: str  # upstream, e.g. "1.7.24"
    debian_version: str  # what scripts/e2e-deps unpacked, e.g. "1.7.24~ds1-6+deb13u1"
    bindir: Path

    @property
    def containerd(self) -> Path:
        return self.bindir / "containerd"

    @property
    def ctr(self) -> Path:
        return self.bindir / "ctr"

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])


@dataclass(frozen=True)
class Runtimes:
    containerd: dict[str, ContainerdBinaries]  # by upstream version
    runc: Path
    busybox: Path
    cri_schema: Path  # upstream k8s.io/cri-api api.proto, to check tests/e2e/cri/api.proto against


def cache_dir() -> Path:
    return Path(os.environ.get("NRI_NUMA_E2E_CACHE", REPO / ".cache" / "runtimes"))


def is_static_elf(path: Path) -> bool:
    """True when the ELF file has no program interpreter (PT_INTERP), i.e. it runs in an empty rootfs."""
    with path.open("rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2:  # 64-bit ELF only: this is amd64
            return False
        phoff, = struct.unpack_from("<Q", header, 32)
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    pt_interp = 3
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != pt_interp for i in range(phnum))


def find_containerd(cache: Path, version: str) -> ContainerdBinaries:
    unpacked = cache / f"containerd-{version}"
    marker = unpacked / ".complete"
    if not marker.is_file():
        raise RuntimesUnavailable(f"containerd {version} is not unpacked in {unpacked}")
    binaries = ContainerdBinaries(version, marker.read_text().strip(), unpacked / "usr" / "bin")
    for exe in (binaries.containerd, binaries.ctr, binaries.bindir / "containerd-shim-runc-v2"):
        if not os.access(exe, os.X_OK):
            raise RuntimesUnavailable(f"{exe} is missing or not executable")
    return binaries


def find_busybox() -> Path:
    for path in BUSYBOX_CANDIDATES:
        if path.is_file():
            if is_static_elf(path):
                return path
            raise RuntimesUnavailable(f"{path} is dynamically linked: the image needs Debian's busybox-static")
    raise RuntimesUnavailable("busybox is not installed (Debian package busybox-static)")


def find_runtimes(cache: Path | None = None) -> Runtimes:
    cache = cache or cache_dir()
    if not os.access(RUNC, os.X_OK):
        raise RuntimesUnavailable(f"{RUNC} is missing (Debian package runc)")
    schema = cache / "cri-api" / CRI_SCHEMA_IN_PACKAGE
    if not schema.is_file():
        raise RuntimesUnavailable(f"the CRI API schema is not unpacked at {schema}")
    return Runtimes(
        containerd={v: find_containerd(cache, v) for v in RUNTIME_VERSIONS},
        runc=RUNC,
        busybox=find_busybox(),
        cri_schema=schema,
    )


def ensure_runtimes() -> Runtimes:
    """The runtimes, fetched with scripts/e2e-deps first when some are missing."""
    try:
        return find_runtimes()
    except RuntimesUnavailable as missing:
        first_reason = str(missing)
    try:
        done = subprocess.run(
            [str(DEPS_SCRIPT)], capture_output=True, text=True, timeout=DEPS_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimesUnavailable(f"{first_reason}; running {DEPS_SCRIPT} failed: {exc}") from exc
    if done.returncode != 0:
        last_error = cache_dir() / "last-error"
        why = last_error.read_text().strip() if last_error.is_file() else done.stderr.strip()[-500:]
        raise RuntimesUnavailable(f"{first_reason}; {DEPS_SCRIPT.name} failed: {why}")
    return find_runtimes()
