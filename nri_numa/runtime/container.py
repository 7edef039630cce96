"""A container and its pod as every runtime reports them, whatever the front door.

NRI messages and OCI specs share the same Linux resources (cpu shares, quota and period, the
memory limit, hugepage limits), the device nodes a container is given, its environment, and the
pod's cgroup parent, annotations and labels. Each front door fills these values from its own
format; ``nri_numa.runtime.to_request`` turns them into the engine's requests in one place.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from nri_numa.safeio.bounds import MAX_NAME, clip, quote
from nri_numa.topology.cpulist import ListFormatError, parse_list

DEVICE_TYPES = ("c", "b", "u", "p")  # OCI: char, block, unbuffered char, FIFO


class RuntimeInputError(ValueError):
    """A runtime value that cannot describe a container; the message names the field."""


def _frozen(mapping: Mapping[str, str], where: str) -> Mapping[str, str]:
    for key, value in mapping.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise RuntimeInputError(f"{where}: {quote(key)} must map a string to a string")
    return MappingProxyType(dict(mapping))


def _optional_int(value: object, where: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise RuntimeInputError(f"{where} must be an integer or unset, not {quote(value)}")


def _name(value: object, what: str, *, required: bool) -> None:
    """An id or name: a string, non-empty where ``required``, at most MAX_NAME characters (a
    longer one is no runtime's id, and would be echoed into every log line about it)."""
    if not isinstance(value, str) or (required and not value):
        qualifier = "a non-empty string" if required else "a string"
        raise RuntimeInputError(f"{what} must be {qualifier}, not {quote(value)}")
    if len(value) > MAX_NAME:
        raise RuntimeInputError(f"{what} {quote(value)} is longer than {MAX_NAME} characters")


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node in the container: ``/dev/nvidia0``, char, major 195, minor 0."""

    path: str
    type: str
    major: int
    minor: int

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise RuntimeInputError(f"device path must be a non-empty string, not "
                                    f"{quote(self.path)}")
        if self.type not in DEVICE_TYPES:
            raise RuntimeInputError(f"device {clip(self.path)}: type {quote(self.type)} is not "
                                    f"one of {', '.join(DEVICE_TYPES)}")
        for attr in ("major", "minor"):
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise RuntimeInputError(f"device {clip(self.path)}: {attr} must be a "
                                        f"non-negative integer, not {quote(value)}")


@dataclass(frozen=True, slots=True)
class RuntimePod:
    """The pod (sandbox) a container belongs to. Outside Kubernetes ``uid``, ``name`` and
    ``namespace`` may be empty; ``cgroup_parent`` is whatever the runtime was given."""

    id: str  # the runtime's sandbox id
    uid: str = ""
    name: str = ""
    namespace: str = ""
    cgroup_parent: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for attr in ("id", "uid", "name", "namespace"):
            _name(getattr(self, attr), f"pod {attr}", required=attr == "id")
        if not isinstance(self.cgroup_parent, str):
            raise RuntimeInputError(f"pod cgroup_parent must be a string, not "
                                    f"{quote(self.cgroup_parent)}")
        object.__setattr__(self, "annotations",
                           _frozen(self.annotations, f"pod {clip(self.id)} annotations"))
        object.__setattr__(self, "labels", _frozen(self.labels, f"pod {clip(self.id)} labels"))


@dataclass(frozen=True, slots=True)
class RuntimeContainer:
    """One container's identity and Linux resources, in the runtime's own units.

    ``None`` means the runtime left a value unset. Hugepage limits are keyed by page size in
    KiB, amounts in bytes. ``cpuset_cpus``/``cpuset_mems`` are what the container has now (the
    runtime's current view), which the plugin compares with what it expects.
    """

    id: str
    name: str
    pod: RuntimePod
    cpu_shares: int | None = None
    cpu_quota: int | None = None  # microseconds per period; -1 or unset: no limit
    cpu_period: int | None = None  # microseconds
    memory_limit: int | None = None  # bytes; -1, 0 or unset: no limit
    hugepage_limits: Mapping[int, int] = field(default_factory=dict)
    devices: tuple[DeviceNode, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    cpuset_cpus: frozenset[int] | None = None
    cpuset_mems: frozenset[int] | None = None

    def __post_init__(self) -> None:
        for attr in ("id", "name"):
            _name(getattr(self, attr), f"container {attr}", required=True)
        where = f"container {clip(self.name)}"
        for attr in ("cpu_shares", "cpu_quota", "cpu_period", "memory_limit"):
            _optional_int(getattr(self, attr), f"{where}: {attr}")
        pages = dict(self.hugepage_limits)
        for size, amount in pages.items():
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise RuntimeInputError(f"{where}: hugepage size {quote(size)} must be a "
                                        "positive number of KiB")
            if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
                raise RuntimeInputError(f"{where}: hugepage limit {quote(amount)} must be a "
                                        "non-negative number of bytes")
        object.__setattr__(self, "hugepage_limits", MappingProxyType(pages))
        object.__setattr__(self, "devices", tuple(self.devices))
        for attr in ("env", "annotations", "labels"):
            object.__setattr__(self, attr, _frozen(getattr(self, attr), f"{where} {attr}"))
        for attr in ("cpuset_cpus", "cpuset_mems"):
            if getattr(self, attr) is not None:
                object.__setattr__(self, attr, frozenset(getattr(self, attr)))


def read_container(id: str, name: str, pod: RuntimePod, *, cpu_shares: int | None = None,
                   cpu_quota: int | None = None, cpu_period: int | None = None,
                   memory_limit: int | None = None,
                   hugepage_limits: Iterable[tuple[str, int]] = (),
                   devices: Iterable[tuple[str, str, int, int]] = (), env: Iterable[str] = (),
                   annotations: Mapping[str, str] | None = None,
                   labels: Mapping[str, str] | None = None, cpus: str = "", mems: str = ""
                   ) -> RuntimeContainer:
    """A container from a runtime's own forms: hugepage limits as (size such as "2MB", bytes),
    device nodes as (path, type, major, minor), the environment as ``NAME=value`` entries,
    cpusets in list syntax (empty: unset). RuntimeInputError naming the container and the
    field."""
    where = f"container {clip(name or id)}"
    pages: dict[int, int] = {}
    try:
        for size, limit in hugepage_limits:
            kib = page_size_kib(size)
            pages[kib] = pages.get(kib, 0) + limit
        nodes = tuple(DeviceNode(*node) for node in devices)
    except RuntimeInputError as e:
        raise RuntimeInputError(f"{where}: {e}") from None
    return RuntimeContainer(
        id=id, name=name, pod=pod, cpu_shares=cpu_shares, cpu_quota=cpu_quota,
        cpu_period=cpu_period, memory_limit=memory_limit, hugepage_limits=pages, devices=nodes,
        env=parse_env(list(env)), annotations=annotations or {}, labels=labels or {},
        cpuset_cpus=parse_cpuset(cpus, f"{where}: cpus"),
        cpuset_mems=parse_cpuset(mems, f"{where}: mems"))


def parse_env(entries: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["A=1", "B=x=y"]`` → ``{"A": "1", "B": "x=y"}``. An entry without ``=`` is a name with
    an empty value (as the OCI runtime passes it); later entries win, as in execve."""
    env: dict[str, str] = {}
    for entry in entries:
        name, _, value = entry.partition("=")
        if name:
            env[name] = value
    return env


# No kernel numbers CPUs or memory nodes this high (x86-64 stops at 8192 CPUs, 1024 nodes). A
# runtime value beyond it is garbage, and expanding "0-4294967295" would take minutes and
# gigabytes: it is refused before it is expanded.
MAX_CPUSET_ID = 65535
_NUMBER = r"[0-9]+"  # compiled (and kept) by re on first use, not at import


def parse_cpuset(text: str, where: str) -> frozenset[int] | None:
    """A cpuset list ("0-3,8") from a runtime; None when empty (unset). RuntimeInputError
    naming ``where`` when it is not a list or names an id above ``MAX_CPUSET_ID``."""
    if not text.strip():
        return None
    if any(len(n.lstrip("0")) > 5 or int(n) > MAX_CPUSET_ID for n in re.findall(_NUMBER, text)):
        raise RuntimeInputError(f"{where}: {quote(text)} names ids above {MAX_CPUSET_ID}, more "
                                "than any kernel has")
    try:
        return parse_list(text)
    except ListFormatError as e:
        raise RuntimeInputError(f"{where}: {e}") from None


_PAGE_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40,
               "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
               "KI": 1 << 10, "MI": 1 << 20, "GI": 1 << 30, "TI": 1 << 40}


def page_size_kib(text: str) -> int:
    """An OCI hugepage size ("2MB", "1GB", "64KB"; binary units, as runc reads them) in KiB.
    The Kubernetes spellings "2Mi" and "2MiB" are taken too."""
    stripped = text.strip()
    digits = len(stripped) - len(stripped.lstrip("0123456789"))
    number, unit = stripped[:digits], stripped[digits:].upper()
    # 19 digits hold any page size; int() of thousands would be slow, or raise past 4300.
    if not number or len(number.lstrip("0")) > 19 or unit not in _PAGE_UNITS:
        raise RuntimeInputError(f"hugepage size {quote(text)} is not a size such as 2MB or 1GB")
    size = int(number) * _PAGE_UNITS[unit]
    if size <= 0 or size % 1024:
        raise RuntimeInputError(f"hugepage size {quote(text)} is not a whole number of KiB")
    return size // 1024
