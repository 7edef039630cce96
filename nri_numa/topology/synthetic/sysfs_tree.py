"""Files and relative links under a synthetic sysfs tree's root, and cpumasks as the kernel
prints them."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


class SysfsTree:
    """Writes files and relative links under a root, creating each folder once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: set[str] = set()

    def _folder(self, relative: str) -> None:
        if relative not in self._made:
            os.makedirs(os.path.join(self.root, relative), exist_ok=True)
            self._made.add(relative)

    def file(self, relative: str, value: object) -> None:
        self.raw(relative, f"{value}\n".encode())

    def raw(self, relative: str, data: bytes) -> None:
        self._folder(os.path.dirname(relative))
        # os.open over open(): a 1024-CPU tree is ~40k files, each written once, which a
        # buffered file object only slows.
        fd = os.open(os.path.join(self.root, relative), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def link(self, relative: str, target: str) -> None:
        """``relative`` → ``target``, both relative to the root; the link itself is relative."""
        folder = os.path.dirname(relative)
        self._folder(folder)
        os.symlink(os.path.relpath(target, folder), os.path.join(self.root, relative))

    def folder(self, relative: str) -> None:
        self._folder(relative)


def kernel_mask(ids: Iterable[int], width: int) -> str:
    """A cpumask as the kernel's %*pb prints it: exactly ``width`` bits in hex, 32-bit groups
    most significant first, the leading group only as wide as it needs (``3``, ``0000,ffffffff``)."""
    value = 0
    for i in ids:
        value |= 1 << i
    digits = f"{value:0{-(-width // 4)}x}"
    head = len(digits) % 8 or 8
    groups = [digits[:head]] + [digits[i:i + 8] for i in range(head, len(digits), 8)]
    return ",".join(groups)
