"""The hook's own annotations, under the project's prefix (``numa.nri.io/``).

* ``numa.nri.io/hook: "true"`` opts a container in: the hooks.d files fire only for containers
  that carry it (``when.annotations``), so nobody else pays for the hook.
* ``numa.nri.io/devices: "nvidia.com/gpu=2,nic=1"`` asks for devices (docs/devices.md; the
  syntax is ``nri_numa.engine.devices.requested``'s, shared by every front door). Only podman's
  precreate stage can give them, by adding them to the spec; a createRuntime hook refuses such a
  container rather than running it without its devices.

Both are taken out before the engine checks the remaining ``numa.nri.io/`` annotations; a pod's
``numa.nri.io/devices.<container>`` stays in, for the engine applies it itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from nri_numa.engine.annotations import DEVICES, PREFIX

HOOK_ANNOTATION = PREFIX + "hook"
DEVICES_ANNOTATION = DEVICES
HOOK_ANNOTATIONS = (HOOK_ANNOTATION, DEVICES_ANNOTATION)


def engine_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    """The annotations under the prefix that the engine judges (policy and scope overrides,
    the pod's per-container device requests)."""
    return {k: v for k, v in annotations.items()
            if k.startswith(PREFIX) and k not in HOOK_ANNOTATIONS}

