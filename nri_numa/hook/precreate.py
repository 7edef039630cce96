"""podman's precreate stage: the spec on stdin, the placed spec on stdout.

precreate runs before the runtime sees the spec, so what it writes there is what runc (and
systemd, under the systemd driver) apply and later re-apply: ``linux.resources.cpu.cpus`` and
``mems``, and the devices it was given (``nri_numa.runtime.device_grant``): the GPUs' and the
NICs' RDMA device nodes with their device-cgroup allow rules, and ``NVIDIA_VISIBLE_DEVICES``.
It is the only stage that can give a container devices.

The stage gets no OCI state: the container's id comes from the spec's ``linux.cgroupsPath``
(``/libpod_parent/libpod-<id>``, or ``machine.slice:libpod:<id>`` under systemd). The container
does not exist yet, so its cgroup is the createRuntime hook's business: podman puts that hook
into the spec before running precreate, and precreate refuses a spec without it, whose
placement would otherwise expire unclaimed.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from nri_numa.engine.decision import Placement
from nri_numa.runtime.device_grant import DEVICE_ACCESS, Grant
from nri_numa.safeio.bounds import quote
from nri_numa.topology.cpulist import format_list

_CONTAINER_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
CLAIMING_STAGES = ("createRuntime", "prestart")


class SpecError(ValueError):
    """A spec precreate cannot place or rewrite; the message says why."""


def container_id(spec: Mapping[str, Any]) -> str:
    """The 64-hex container id podman put in ``linux.cgroupsPath``."""
    linux = spec.get("linux")
    path = linux.get("cgroupsPath") if isinstance(linux, dict) else None
    found = _CONTAINER_ID.search(path) if isinstance(path, str) else None
    if found is None:
        raise SpecError(f"cannot tell the container id: linux.cgroupsPath is {quote(path)}, "
                        "which holds no 64-hex id (precreate is a podman stage)")
    return found.group(0)


PYTHON_CLIENT = "nri_numa/hook/client.py"  # run by path (docs/oci-hook.md, "The thin clients")
C_CLIENT = "nri-numa-hook-client"  # the compiled client (docs/oci-hook.md, "The C client")


def _is_hook_client(arg: str) -> bool:
    return arg in ("hook", C_CLIENT) or arg.endswith((PYTHON_CLIENT, "/" + C_CLIENT))


def has_claiming_hook(spec: Mapping[str, Any]) -> bool:
    """Whether the spec runs ``nri-numa hook createRuntime`` (or ``prestart``), the Python
    client ``python3 -I -S …/nri_numa/hook/client.py createRuntime`` or the C client
    ``…/nri-numa-hook-client createRuntime``."""
    hooks = spec.get("hooks")
    if not isinstance(hooks, dict):
        return False
    for stage in CLAIMING_STAGES:
        for hook in hooks.get(stage) or ():
            args = hook.get("args") if isinstance(hook, dict) else None
            if isinstance(args, list) and any(
                    isinstance(a, str) and _is_hook_client(a) and b in CLAIMING_STAGES for a, b in zip(args, args[1:])):
                return True
    return False


def placed_spec(spec: Mapping[str, Any], placement: Placement, grant: Grant) -> dict[str, Any]:
    """A copy of ``spec`` with the placement and the ``grant`` of its devices written into it."""
    out = copy.deepcopy(dict(spec))
    linux = _child(out, "linux", "spec")
    resources = _child(linux, "resources", "linux")
    cpu = _child(resources, "cpu", "linux.resources")
    cpu["cpus"] = format_list(placement.cpus)
    if placement.mems is not None:
        cpu["mems"] = format_list(placement.mems)
    if grant:
        _add_grant(out, linux, resources, grant)
    return out


def _add_grant(spec: dict[str, Any], linux: dict[str, Any], resources: dict[str, Any],
               grant: Grant) -> None:
    devices = _list(linux, "devices", "linux")
    rules = _list(resources, "devices", "linux.resources")
    present = {d.get("path") for d in devices if isinstance(d, dict)}
    for node in grant.nodes:
        if node.path not in present:
            devices.append({"path": node.path, "type": node.type, "major": node.major,
                            "minor": node.minor, "fileMode": node.file_mode, "uid": node.uid,
                            "gid": node.gid})
        rules.append({"allow": True, "type": node.type, "major": node.major,
                      "minor": node.minor, "access": DEVICE_ACCESS})
    if grant.env:
        process = _child(spec, "process", "spec")
        env = [e for e in _list(process, "env", "process")
               if not (isinstance(e, str) and e.partition("=")[0] in grant.env)]
        env += [f"{k}={v}" for k, v in sorted(grant.env.items())]
        process["env"] = env


def _child(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = parent.setdefault(key, {})
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise SpecError(f"{where}.{key} must be an object")
    return value


def _list(parent: dict[str, Any], key: str, where: str) -> list[Any]:
    value = parent.setdefault(key, [])
    if value is None:
        value = parent[key] = []
    if not isinstance(value, list):
        raise SpecError(f"{where}.{key} must be a list")
    return value
