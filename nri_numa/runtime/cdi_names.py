"""CDI device names, and the names a container was given in its annotations.

* **Names**: ``vendor/class=device`` (``nvidia.com/gpu=GPU-8f2c…``). The vendor and the class
  start with a letter, end with a letter or digit and hold letters, digits, ``_``, ``-`` and
  ``.``; the device starts and ends with a letter or digit and may also hold ``:``.
* **Annotations**: device plugins and the CRI put the names a container gets in annotations
  whose key starts with ``cdi.k8s.io/``; the value is a comma-separated list of names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from nri_numa.runtime.device_markers import CDI_ANNOTATION_PREFIX as ANNOTATION_PREFIX
from nri_numa.safeio.bounds import quote

_VENDOR_OR_CLASS = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")


class CdiNameError(ValueError):
    """Not a fully qualified CDI device name; the message says which part is wrong."""


@dataclass(frozen=True, slots=True)
class CdiName:
    vendor: str  # nvidia.com
    device_class: str  # gpu
    device: str  # GPU-8f2c…, 0, all

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.device_class}"

    def __str__(self) -> str:
        return f"{self.kind}={self.device}"


def parse_kind(text: str) -> tuple[str, str]:
    """``vendor/class`` → (vendor, class); CdiNameError naming the bad part."""
    try:
        return _split_kind(text)
    except CdiNameError as e:
        raise CdiNameError(f"{quote(text)} is not a CDI kind: {e}") from None


def parse_name(text: str) -> CdiName:
    """``vendor/class=device`` → CdiName; CdiNameError naming the bad part."""
    kind, equals, device = text.partition("=")
    try:
        if not equals:
            raise CdiNameError("no '=' before the device (vendor.com/class=name)")
        vendor, device_class = _split_kind(kind)
        if not _DEVICE.fullmatch(device):
            raise CdiNameError(f"device {quote(device)} must start and end with a letter or "
                               "digit, and hold only letters, digits, '_', '-', '.', ':'")
    except CdiNameError as e:
        raise CdiNameError(f"{quote(text)} is not a CDI device name: {e}") from None
    return CdiName(vendor, device_class, device)


def _split_kind(kind: str) -> tuple[str, str]:
    vendor, slash, device_class = kind.partition("/")
    if not slash:
        raise CdiNameError("no '/' between vendor and class (vendor.com/class)")
    for what, part in (("vendor", vendor), ("class", device_class)):
        if not _VENDOR_OR_CLASS.fullmatch(part):
            raise CdiNameError(f"{what} {quote(part)} must start with a letter, end with a "
                               "letter or digit, and hold only letters, digits, '_', '-', '.'")
    return vendor, device_class


def annotation_names(annotations: Mapping[str, str]) -> tuple[list[CdiName], list[str]]:
    """The CDI names in a container's ``cdi.k8s.io/*`` annotations, and one line per value
    that is not a name (the annotation is someone else's: it is reported, not refused)."""
    names: list[CdiName] = []
    problems: list[str] = []
    for key in sorted(k for k in annotations if k.startswith(ANNOTATION_PREFIX)):
        for item in annotations[key].split(","):
            try:
                names.append(parse_name(item.strip()))
            except CdiNameError as e:
                problems.append(f"annotation {key}: {e}")
    return names, problems
