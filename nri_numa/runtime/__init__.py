"""Below both front doors: containers as runtimes report them, and their translation into the
engine's requests. Nothing here knows NRI or the OCI hook; both use it.

Each name is loaded on first use (``__getattr__`` below): importing any module of this package
runs this file first, and an OCI hook process placing a container without devices should not
load the device grants and CDI (``device_grant``, ``cdi``) for it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nri_numa.runtime.container import (DeviceNode, RuntimeContainer, RuntimeInputError,
                                            RuntimePod, page_size_kib, parse_env)
    from nri_numa.runtime.device_grant import DeviceGranter, Grant, GrantedNode, GrantError
    from nri_numa.runtime.device_locator import DeviceLocator
    from nri_numa.runtime.to_request import (asked_devices, container_request,
                                             cpu_limit_millicores, cpu_request_millicores,
                                             pod_identity, pod_qos, pod_request,
                                             qos_from_cgroup_parent, requested_devices,
                                             stale_choice, with_scheduled_numa)

__all__ = [
    "DeviceGranter", "DeviceLocator", "DeviceNode", "Grant", "GrantError", "GrantedNode",
    "RuntimeContainer", "RuntimeInputError", "RuntimePod", "asked_devices", "container_request",
    "cpu_limit_millicores", "cpu_request_millicores", "page_size_kib", "parse_env",
    "pod_identity", "pod_qos", "pod_request", "qos_from_cgroup_parent", "requested_devices",
    "stale_choice", "with_scheduled_numa",
]

_FROM_CONTAINER = {"DeviceNode", "RuntimeContainer", "RuntimeInputError", "RuntimePod",
                   "page_size_kib", "parse_env"}
_FROM_DEVICE_GRANT = {"DeviceGranter", "Grant", "GrantedNode", "GrantError"}


def __getattr__(name: str) -> Any:
    # Import statements rather than a table of module names, so that the import graph test
    # (tests/unit/test_import_graph.py) still sees each of these edges.
    if name in _FROM_CONTAINER:
        from nri_numa.runtime import container as module
    elif name in _FROM_DEVICE_GRANT:
        from nri_numa.runtime import device_grant as module
    elif name == "DeviceLocator":
        from nri_numa.runtime import device_locator as module
    elif name in __all__:
        from nri_numa.runtime import to_request as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
