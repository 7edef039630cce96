"""The hook's own annotations, under the project's prefix (``numa.nri.io/``).

* ``numa.nri.io/hook: "true"`` opts a container in: the hooks.d files fire only for containers
  that carry it (``when.annotations``), so nobody else pays for the hook.
* ``numa.nri.io/devices: "nvidia.com/gpu=2"`` asks for devices (``resource=count``, comma
  separated). Only podman's precreate stage can give them, by adding them to the spec; a
  createRuntime hook refuses such a container rather than running it without its devices.

Both are the hook's business: they are taken out before the engine checks the remaining
``numa.nri.io/`` annotations (which refuses names it does not know).
"""

from __future__ import annotations

from collections.abc import Mapping

from nri_numa.engine.annotations import PREFIX

HOOK_ANNOTATION = PREFIX + "hook"
DEVICES_ANNOTATION = PREFIX + "devices"
HOOK_ANNOTATIONS = (HOOK_ANNOTATION, DEVICES_ANNOTATION)


class HookAnnotationError(ValueError):
    """A hook annotation that cannot be read; the message names it and its value."""


def engine_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    """The annotations under the prefix that the engine judges (policy and scope overrides)."""
    return {k: v for k, v in annotations.items()
            if k.startswith(PREFIX) and k not in HOOK_ANNOTATIONS}


def device_request(annotations: Mapping[str, str]) -> dict[str, int]:
    """``numa.nri.io/devices`` as resource → count; empty when absent."""
    raw = annotations.get(DEVICES_ANNOTATION, "").strip()
    if not raw:
        return {}
    counts: dict[str, int] = {}
    for item in raw.split(","):
        name, sep, count = (part.strip() for part in item.partition("="))
        if not sep or not name or not count.isdigit() or int(count) == 0:
            raise HookAnnotationError(
                f'annotation {DEVICES_ANNOTATION}: "{item.strip()}" is not resource=count '
                "(a positive count), e.g. nvidia.com/gpu=1")
        if name in counts:
            raise HookAnnotationError(f"annotation {DEVICES_ANNOTATION}: {name} is named twice")
        counts[name] = int(count)
    return counts
