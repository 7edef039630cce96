"""Containers whose CPUs a DRA CPU driver gives: kubernetes-sigs/dra-driver-cpu (docs/devices.md,
"Beside DRA drivers").

That driver allocates CPUs to a ResourceClaim and hands them to the container through CDI as
the environment variable ``DRA_CPUSET_<claim UID>=<cpuset>``; its own NRI plugin then pins the
container to them. nri-numa does not fight it: a container that carries such a variable is left
alone (no cpuset, no memory nodes, no record), with one line naming the claims.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from nri_numa.safeio.bounds import clip

log = logging.getLogger("nri_numa.nri.plugin")

PREFIX = "DRA_CPUSET_"


def cpu_claims(env: Mapping[str, str]) -> dict[str, str]:
    """The container's ``DRA_CPUSET_*`` variables: claim → the CPUs the driver gave."""
    return {key.removeprefix(PREFIX): value for key, value in env.items()
            if key.startswith(PREFIX)}


def left_to_driver(pod: str, container: str, claims: Mapping[str, str]) -> None:
    named = ", ".join(f"{PREFIX}{clip(k, 60)}={clip(v, 60)}" for k, v in sorted(claims.items()))
    log.info("left to a DRA CPU driver: pod %s container %s (%s): nri-numa sets no cpuset for it",
             pod, clip(container), named)
