"""CDI (the Container Device Interface, cncf-tags/container-device-interface) as far as nri-numa
needs it: to read which devices a container already got through CDI, and to name a GPU by its
CDI name when the runtime is to inject it (docs/devices.md, "CDI").

* **Names** and **annotations**: ``nri_numa.runtime.cdi_names``.
* **Spec files**: ``*.json`` and ``*.yaml`` directly in the spec dirs (``/etc/cdi`` then
  ``/var/run/cdi``: a later dir wins a name both define; two files of one dir defining the
  same name make it unresolvable, as in CDI's own cache). Only what locating a device needs is
  read: ``cdiVersion``, ``kind``, ``devices[].name`` and the ``deviceNodes`` (``path``,
  ``hostPath``, ``type``, ``major``, ``minor``) of each device's ``containerEdits`` and of the
  spec's own. A broken file belongs to someone else: it is skipped with one warning naming it
  (again only once it changes), and never fails a container.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nri_numa.runtime.cdi_names import CdiName, CdiNameError, parse_kind, parse_name
from nri_numa.runtime.container import DeviceNode, RuntimeInputError
from nri_numa.safeio.bounds import quote
from nri_numa.safeio.documents import DocumentError, NotParsedError, load_json, load_yaml

log = logging.getLogger(__name__)

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
SPEC_SUFFIXES = (".json", ".yaml")
NVIDIA_GPU_KIND = "nvidia.com/gpu"
ALL_DEVICES = "all"  # nvidia-ctk's name for every GPU: says nothing about where to run
NODE_TYPES = ("c", "u", "b", "p")

_NVIDIA_GPU_NODE = re.compile(r"/dev/nvidia\d+")
_MAX_WARNED = 1024  # distinct bad annotation values remembered, so each is logged once
MAX_SPEC_BYTES = 4 << 20  # nvidia-ctk's spec for 8 GPUs is about 10 kB


class SpecError(ValueError):
    """A CDI spec file nri-numa cannot use; the message names the file and the problem."""


# --- spec files ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CdiNode:
    """A ``deviceNodes`` entry: ``path`` in the container, ``host_path`` on the host (the same
    unless the spec says ``hostPath``); type and numbers when the spec gives them."""

    path: str
    host_path: str
    type: str | None = None
    major: int | None = None
    minor: int | None = None


@dataclass(frozen=True, slots=True)
class CdiDevice:
    name: CdiName
    nodes: tuple[CdiNode, ...]  # the device's own containerEdits
    spec_nodes: tuple[CdiNode, ...]  # the spec's containerEdits, injected with any of its devices
    spec_file: str


def read_spec(path: str | Path) -> tuple[CdiDevice, ...]:
    """The devices of one spec file; SpecError naming the file and what is wrong. The file's
    size, nesting, values and tags are bounded before it is parsed (nri_numa.safeio.documents)."""
    path = Path(path)
    where = f"CDI spec {path}"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
        if len(raw) > MAX_SPEC_BYTES:
            raise SpecError(f"{where}: larger than {MAX_SPEC_BYTES >> 20} MiB, more than any "
                            "CDI spec")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{where}: cannot read it: {e}") from None
    try:
        if path.suffix == ".json":
            document = load_json(text, where)
        else:
            documents = load_yaml(text, where, fast=True)
            if len(documents) > 1:
                raise SpecError(f"{where}: holds {len(documents)} YAML documents; a spec is one")
            document = documents[0] if documents else None
    except NotParsedError as e:
        raise SpecError(f"{where}: not {path.suffix[1:].upper()}: {e.detail}") from None
    except DocumentError as e:
        raise SpecError(str(e)) from None
    try:
        return parse_spec(document, str(path))
    except (SpecError, CdiNameError, RuntimeInputError) as e:
        raise SpecError(f"{where}: {e}") from None


def parse_spec(document: Any, where: str = "") -> tuple[CdiDevice, ...]:
    """The devices a parsed spec document defines; SpecError / CdiNameError on bad fields."""
    spec = _mapping(document, "the spec")
    version = spec.get("cdiVersion")
    if not isinstance(version, str) or not version:
        raise SpecError("cdiVersion must be a non-empty string")
    kind = spec.get("kind")
    if not isinstance(kind, str):
        raise SpecError("kind must be a string (vendor.com/class)")
    vendor, device_class = parse_kind(kind)
    shared = _nodes(spec.get("containerEdits"), "containerEdits")
    entries = spec.get("devices")
    if not isinstance(entries, list):
        raise SpecError("devices must be a list")
    devices: dict[str, CdiDevice] = {}
    for i, entry in enumerate(entries):
        device = _mapping(entry, f"devices[{i}]")
        name = device.get("name")
        if not isinstance(name, str):
            raise SpecError(f"devices[{i}].name must be a string")
        qualified = parse_name(f"{kind}={name}")
        if name in devices:
            raise SpecError(f"device {quote(name)} is defined twice")
        devices[name] = CdiDevice(CdiName(vendor, device_class, qualified.device),
                                  _nodes(device.get("containerEdits"),
                                         f"devices[{i}].containerEdits"), shared, where)
    return tuple(devices.values())


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(f"{what} must be a map, not {type(value).__name__}")
    return value


def _nodes(edits: Any, where: str) -> tuple[CdiNode, ...]:
    if edits is None:
        return ()
    entries = _mapping(edits, where).get("deviceNodes") or []
    if not isinstance(entries, list):
        raise SpecError(f"{where}.deviceNodes must be a list")
    return tuple(_node(entry, f"{where}.deviceNodes[{i}]") for i, entry in enumerate(entries))


def _node(entry: Any, where: str) -> CdiNode:
    node = _mapping(entry, where)
    path, host_path = node.get("path"), node.get("hostPath") or node.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise SpecError(f"{where}.path must be an absolute path, not {quote(path)}")
    if not isinstance(host_path, str) or not host_path.startswith("/"):
        raise SpecError(f"{where}.hostPath must be an absolute path, not {quote(host_path)}")
    kind = node.get("type") or None
    if kind is not None and kind not in NODE_TYPES:
        raise SpecError(f"{where}.type {quote(kind)} is not one of {', '.join(NODE_TYPES)}")
    numbers = []
    for key in ("major", "minor"):
        value = node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise SpecError(f"{where}.{key} must be a non-negative integer, not {quote(value)}")
        numbers.append(value)
    return CdiNode(path, host_path, kind, numbers[0], numbers[1])


def device_node(node: CdiNode) -> DeviceNode | None:
    """The node as the runtime will create it: the spec's type and numbers, else those of the
    host's node (as CDI fills them in); None when neither says (a missing host node, a fifo)."""
    kind, major, minor = node.type, node.major, node.minor
    if kind is None or major is None or minor is None:
        host = host_device(node.host_path)
        if host is None:
            return None
        kind = kind or host[0]
        major = host[1] if major is None else major
        minor = host[2] if minor is None else minor
    if kind == "p":
        return None
    return DeviceNode(node.path, kind, major, minor)


def host_device(path: str | Path) -> tuple[str, int, int] | None:
    """(type, major, minor) of the host's device node at ``path``: ``c`` or ``b``; None when
    it is absent or not a device node."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        return "c", os.major(st.st_rdev), os.minor(st.st_rdev)
    if stat.S_ISBLK(st.st_mode):
        return "b", os.major(st.st_rdev), os.minor(st.st_rdev)
    return None


# --- the spec dirs -------------------------------------------------------------------------


_Signature = tuple[int, int, int]  # inode, size, mtime: a file rewritten in place is read again


class CdiRegistry:
    """The devices of the CDI spec files in ``spec_dirs``, read again whenever a file is added,
    changed or removed (each lookup lists the dirs and stats their files; only changed files are
    parsed). ``warn`` gets one line per broken file and per name conflict, once per version of
    the file."""

    def __init__(self, spec_dirs: Sequence[str | Path] = DEFAULT_SPEC_DIRS,
                 warn: Callable[[str], None] | None = None) -> None:
        self.spec_dirs = tuple(Path(d) for d in spec_dirs)
        self._warn = warn if warn is not None else log.warning
        self._lock = threading.Lock()
        self._files: dict[Path, tuple[_Signature, tuple[CdiDevice, ...]]] = {}
        self._devices: dict[str, CdiDevice] = {}
        self._seen: tuple[tuple[Path, _Signature], ...] = ()
        self._warned: set[tuple[str, _Signature | None]] = set()

    def devices(self) -> dict[str, CdiDevice]:
        """Qualified name → device, as the files are now."""
        with self._lock:
            self._refresh()
            return dict(self._devices)

    def device(self, name: str | CdiName) -> CdiDevice | None:
        return self.devices().get(str(name))

    def gpu_device_name(self, uuid: str, index: int, minor: int | None) -> str | None:
        """The CDI name that injects this GPU: ``nvidia.com/gpu=<uuid>``; else a device whose own
        nodes hold exactly one GPU node, ``/dev/nvidia<minor>`` (any kind: NVIDIA's device
        plugin writes ``k8s.device-plugin.nvidia.com/gpu``), ``nvidia.com/gpu`` first; else
        ``nvidia.com/gpu=<index>``. None when no spec names it."""
        devices = self.devices()
        node = None if minor is None else f"/dev/nvidia{minor}"
        by_uuid = [d for d in devices.values() if d.name.device == uuid]
        by_node = [d for d in devices.values()
                   if node is not None and _gpu_nodes(d) == {node}]
        by_index = [d for d in devices.values()
                    if d.name.kind == NVIDIA_GPU_KIND and d.name.device == str(index)]
        for found in (by_uuid, by_node, by_index):
            if found:
                best = min(found, key=lambda d: (d.name.kind != NVIDIA_GPU_KIND, str(d.name)))
                return str(best.name)
        return None

    def _refresh(self) -> None:
        listing = tuple(self._list())
        if listing == self._seen:
            return
        self._seen = listing
        files: dict[Path, tuple[_Signature, tuple[CdiDevice, ...]]] = {}
        for path, signature in listing:
            cached = self._files.get(path)
            if cached is not None and cached[0] == signature:
                files[path] = cached
                continue
            try:
                files[path] = (signature, read_spec(path))
            except SpecError as e:
                self._warn_once(str(path), signature, f"{e}; its devices are ignored")
                files[path] = (signature, ())
        self._files = files
        self._devices = self._resolve(listing)

    def _list(self) -> Iterable[tuple[Path, _Signature]]:
        for folder in self.spec_dirs:
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue  # a missing dir is the usual case, as for CDI itself
            for entry in entries:
                if not entry.name.endswith(SPEC_SUFFIXES):
                    continue
                try:
                    if not entry.is_file():
                        continue
                    st = entry.stat()
                except OSError:
                    continue
                yield Path(entry.path), (st.st_ino, st.st_size, st.st_mtime_ns)

    def _resolve(self, listing: Sequence[tuple[Path, _Signature]]) -> dict[str, CdiDevice]:
        """A later dir overrides an earlier one; two files of one dir with the same name make
        it unresolvable (CDI's rule), with a warning."""
        chosen: dict[str, tuple[int, CdiDevice]] = {}
        conflicts: set[str] = set()
        rank = {d: i for i, d in enumerate(self.spec_dirs)}
        for path, _ in listing:
            priority = rank.get(path.parent, 0)
            for device in self._files[path][1]:
                name = str(device.name)
                held = chosen.get(name)
                if held is not None and held[0] == priority:
                    conflicts.add(name)
                    self._warn_once(f"{name} {held[1].spec_file} {device.spec_file}", None,
                                    f"CDI device {name} is defined by both {held[1].spec_file} "
                                    f"and {device.spec_file}: neither is used")
                    continue
                chosen[name] = (priority, device)
        return {n: d for n, (_, d) in chosen.items() if n not in conflicts}

    def _warn_once(self, key: str, signature: _Signature | None, message: str) -> None:
        if (key, signature) in self._warned:
            return
        if len(self._warned) >= _MAX_WARNED:
            self._warned.clear()
        self._warned.add((key, signature))
        self._warn(message)


def _gpu_nodes(device: CdiDevice) -> set[str]:
    return {n.path for n in device.nodes if _NVIDIA_GPU_NODE.fullmatch(n.path)}


# --- whether the runtime injects CDI devices an NRI plugin names ---------------------------

NODES, CDI, AUTO = "nodes", "cdi", "auto"
INJECTION_MODES = (NODES, CDI, AUTO)
# containerd applies ContainerAdjustment.CDI_devices from 2.1.0 (containerd commit 74af78b,
# "cri,nri: allow plugins to inject devices using CDI"). 2.0 drops them silently; 1.7 does from
# 1.7.30 only where the CRI config says enable_cdi = true (off by default, and a plugin cannot
# see it), so `auto` does not count on it.
CONTAINERD_FIRST_CDI = (2, 1, 0)
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def runtime_applies_cdi(name: str, version: str) -> bool:
    """Whether the runtime that configured the plugin (Configure's runtime_name and
    runtime_version: ``containerd``, ``2.1.9+unknown``) is known to inject the CDI devices an
    adjustment names."""
    if name != "containerd":
        return False
    m = _VERSION.match(version.strip())
    if m is None:
        return False
    return (int(m[1]), int(m[2]), int(m[3] or 0)) >= CONTAINERD_FIRST_CDI
