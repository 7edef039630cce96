"""Reading single sysfs files without ever raising.

Every reader takes the ``warnings`` list that discovery carries and returns ``None`` when the
value cannot be had, after appending a sentence that names the file and the problem. A file that
is simply absent is often normal (older kernels, other architectures), so absence is reported
only where the caller says the file is ``required``; a file that exists but cannot be read or
parsed is always reported, because that means the tree is damaged.

Symlinks are resolved against the tree's own root rather than the host's: a fake tree under
``/tmp`` may hold absolute links such as ``/sys/devices/...`` that must not reach the live /sys.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from typing import TypeVar

from nri_numa.topology.cpulist import parse_list, parse_mask

# What sysfs pads values with; hwloc's dumps also end some files in NUL bytes.
_JUNK = " \t\r\n\x00"
# Linux gives up after 40 links in one lookup (MAXSYMLINKS); so do we, to survive link loops.
_MAX_LINKS = 40
_CHUNK = 65536
# Bounds that no real sysfs file reaches (NR_CPUS is at most 8192 today, a cpulist a few pages)
# and that keep a garbage file from costing gigabytes: "0-4294967295" is billions of integers.
_MAX_MEMBER = 1 << 16
_MAX_BYTES = 1 << 22
_NUMBER = re.compile(r"\d+")

PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")

T = TypeVar("T")
PathArg = str | os.PathLike[str]


def read_text(path: PathArg, warnings: list[str], *, required: bool = True) -> str | None:
    """The file's text without surrounding whitespace and NULs, or None (and maybe a warning)."""
    try:
        raw = _read_bytes(path)
    except (FileNotFoundError, NotADirectoryError):
        if required:
            warnings.append(f"{path} is missing")
        return None
    except IsADirectoryError:
        warnings.append(f"{path} is a directory, not a file")
        return None
    except (OSError, ValueError) as e:
        warnings.append(f"cannot read {path}: {_reason(e)}")
        return None
    try:
        return raw.decode("ascii").strip(_JUNK)
    except UnicodeDecodeError:
        warnings.append(f"{path} is not text: {raw[:40]!r}")
        return None


def read_int(path: PathArg, warnings: list[str], *, required: bool = True) -> int | None:
    """A decimal integer such as ``physical_package_id`` or ``numa_node`` (may be negative)."""
    return _parsed(path, warnings, required, lambda s: int(s, 10), "a decimal integer")


def read_hex(path: PathArg, warnings: list[str], *, required: bool = True) -> int | None:
    """A hex integer such as a PCI ``class`` (``0x030200``) or ``vendor`` (``0x10de``)."""
    return _parsed(path, warnings, required, lambda s: int(s, 16), "a hex integer")


def read_cpu_list(path: PathArg, warnings: list[str], *,
                  required: bool = True) -> frozenset[int] | None:
    """A kernel list such as ``0-3,8``; an empty file is the empty set."""
    return _parsed(path, warnings, required, _bounded_list, "a list such as 0-3,8")


def read_cpu_mask(path: PathArg, warnings: list[str], *,
                  required: bool = True) -> frozenset[int] | None:
    """A kernel mask such as ``00000000,0000ffff``; an empty file is the empty set."""
    return _parsed(path, warnings, required, _bounded_mask, "a hex mask such as 0000ffff")


def read_list_or_mask(directory: str, list_name: str, mask_name: str, warnings: list[str],
                      *, required: bool = True) -> frozenset[int] | None:
    """The ``list_name`` file, or the ``mask_name`` file where the list is absent or bad.

    Older kernels have only the masks; a damaged list file still leaves the mask to read.
    """
    list_path, mask_path = f"{directory}/{list_name}", f"{directory}/{mask_name}"
    value = read_cpu_list(list_path, warnings, required=False)
    if value is not None:
        return value
    value = read_cpu_mask(mask_path, warnings, required=False)
    if value is None and required and not _exists(list_path) and not _exists(mask_path):
        warnings.append(f"{directory} has neither {list_name} nor {mask_name}")
    return value


def link_basename(path: PathArg) -> str | None:
    """The last component of a symlink's target (a ``driver`` link → ``mlx5_core``), or None."""
    try:
        return os.path.basename(os.readlink(path).rstrip("/")) or None
    except (OSError, ValueError):
        return None


def resolve_in_root(root: PathArg, path: PathArg, warnings: list[str]) -> str | None:
    """``path`` (inside ``root``) with every symlink followed, where ``/`` means ``root``.

    Returns None, with a warning, when a link dangles or loops. A ``..`` at the root stays at the
    root, as it does in the kernel, so no link can lead out of the tree.
    """
    root_text = os.path.abspath(root)
    relative = os.path.relpath(os.path.abspath(path), root_text)
    if relative == ".." or relative.startswith("../"):
        warnings.append(f"{path} is outside the tree {root_text}")
        return None
    pending = [p for p in reversed(relative.split("/"))]  # a stack: next component last
    resolved: list[str] = []
    links = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        here = os.path.join(root_text, *resolved, part)
        try:
            target = os.readlink(here)
        except (FileNotFoundError, NotADirectoryError):
            warnings.append(f"{path} leads to {here}, which does not exist")
            return None
        except OSError as e:
            if e.errno != errno.EINVAL:
                warnings.append(f"cannot follow {here}: {_reason(e)}")
                return None
            resolved.append(part)  # EINVAL: not a link but a plain directory or file
            continue
        links += 1
        if links > _MAX_LINKS:
            warnings.append(f"{path}: too many levels of symbolic links")
            return None
        if target.startswith("/"):
            resolved = []
        pending.extend(reversed(target.split("/")))
    return os.path.join(root_text, *resolved)


def pci_address_of(path: str) -> str | None:
    """The last component of a resolved sysfs path that is a PCI function address."""
    for part in reversed(path.split("/")):
        if PCI_ADDRESS.fullmatch(part):
            return part
    return None


def _parsed(path: PathArg, warnings: list[str], required: bool, parse: Callable[[str], T],
            expected: str) -> T | None:
    text = read_text(path, warnings, required=required)
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError:  # ListFormatError included
        warnings.append(f"{path}: expected {expected}, found {text[:60]!r}")
        return None


def _bounded_list(text: str) -> frozenset[int]:
    if any(int(n) > _MAX_MEMBER for n in _NUMBER.findall(text)):
        raise ValueError(f"a number above {_MAX_MEMBER}")
    return parse_list(text)


def _bounded_mask(text: str) -> frozenset[int]:
    digits = text.replace(",", "").strip(_JUNK).removeprefix("0x").lstrip("0")
    if len(digits) * 4 > _MAX_MEMBER:
        raise ValueError(f"a bit above {_MAX_MEMBER}")
    return parse_mask(text)


def _read_bytes(path: PathArg) -> bytes:
    # os.open/os.read rather than open(): half the cost, which matters at thousands of files.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, _CHUNK)]
        while len(chunks[-1]) == _CHUNK:  # bin attributes (big cpulists) can exceed one page
            if len(chunks) * _CHUNK >= _MAX_BYTES:
                raise ValueError(f"larger than {_MAX_BYTES} bytes, not a sysfs value")
            chunks.append(os.read(fd, _CHUNK))
    finally:
        os.close(fd)
    return b"".join(chunks)


def _exists(path: str) -> bool:
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):
        return False


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__
