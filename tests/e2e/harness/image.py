"""A one-layer OCI image built from busybox-static, written as an OCI image-layout tarball that
`ctr images import` reads. There is no registry here, so this image is both the workload image and
containerd's sandbox ("pause") image.

The layer is built byte for byte the same on every run (fixed times and owners), so its digest is
stable and a re-import is a no-op."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

IMAGE_REF = "docker.io/library/nri-numa-busybox:e2e"
# busybox's sleep is PID 1 in its container and so ignores SIGTERM; SIGKILL makes every stop prompt.
STOP_SIGNAL = "SIGKILL"
LONG_SLEEP = ["/bin/sleep", "86400"]
EMPTY_DIRS = ("dev", "etc", "proc", "root", "run", "sys", "tmp", "var", "bin", "sbin", "usr/bin", "usr/sbin")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"


@dataclass(frozen=True)
class BuiltImage:
    ref: str
    tarball: Path
    config_digest: str  # "sha256:…", what CRI reports as the image id


@dataclass(frozen=True)
class Blob:
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self, media_type: str, **extra: object) -> dict[str, object]:
        return {"mediaType": media_type, "digest": self.digest, "size": len(self.data), **extra}


def applet_paths(busybox: Path) -> list[str]:
    """Where busybox's applets live ("bin/sh", "usr/bin/awk", ...), as the binary itself says."""
    listed = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True, check=True)
    return sorted({line.strip() for line in listed.stdout.splitlines() if line.strip()} - {"bin/busybox"})


def _add(tar: tarfile.TarFile, info: tarfile.TarInfo, data: bytes | None = None) -> None:
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _dir(name: str, mode: int = 0o755) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    return info


def _file(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    return info, data


def rootfs_layer(busybox: Path) -> bytes:
    """An uncompressed tar: /bin/busybox, a symlink per applet, the usual empty dirs, a root user."""
    buffer = io.BytesIO()
    applets = applet_paths(busybox)
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in EMPTY_DIRS:
            _add(tar, _dir(name, 0o1777 if name == "tmp" else 0o755))
        _add(tar, *_file("bin/busybox", busybox.read_bytes(), 0o755))
        _add(tar, *_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"))
        _add(tar, *_file("etc/group", b"root:x:0:\n"))
        for path in applets:
            link = tarfile.TarInfo(path)
            link.type = tarfile.SYMTYPE
            link.linkname = "/bin/busybox"
            link.mode = 0o777
            _add(tar, link)
    return buffer.getvalue()


def image_config(layer: Blob) -> Blob:
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Cmd": LONG_SLEEP,
            "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
            "WorkingDir": "/",
            "StopSignal": STOP_SIGNAL,
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
        "history": [{"created_by": "nri-numa tests/e2e/harness/image.py (busybox-static)"}],
    }
    return Blob(json.dumps(config, sort_keys=True).encode())


def build_image(busybox: Path, out_dir: Path, ref: str = IMAGE_REF) -> BuiltImage:
    """Writes `<out_dir>/busybox-oci.tar` (an OCI image layout) and says what it holds."""
    layer = Blob(rootfs_layer(busybox))
    config = image_config(layer)
    manifest = Blob(json.dumps({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config.descriptor(OCI_CONFIG),
        "layers": [layer.descriptor(OCI_LAYER)],
    }, sort_keys=True).encode())
    # ctr names the imported image after io.containerd.image.name; ref.name is the OCI spelling.
    index = {
        "schemaVersion": 2,
        "manifests": [manifest.descriptor(
            OCI_MANIFEST,
            platform={"architecture": "amd64", "os": "linux"},
            annotations={"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]},
        )],
    }
    tarball = out_dir / "busybox-oci.tar"
    with tarfile.open(tarball, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, *_file("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()))
        _add(tar, *_file("index.json", json.dumps(index, sort_keys=True).encode()))
        _add(tar, _dir("blobs"))
        _add(tar, _dir("blobs/sha256"))
        for blob in (layer, config, manifest):
            _add(tar, *_file("blobs/sha256/" + blob.digest.split(":", 1)[1], blob.data))
    return BuiltImage(ref=ref, tarball=tarball, config_digest=config.digest)


def import_image(ctr: Path, address: str, image: BuiltImage, timeout_s: float = 60) -> str:
    """`ctr -n k8s.io images import`: the namespace the CRI plugin reads. Returns ctr's output."""
    done = subprocess.run(
        [str(ctr), "--address", address, "--namespace", "k8s.io", "images", "import", str(image.tarball)],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ctr images import {image.tarball} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout + done.stderr
