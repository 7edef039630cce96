"""Below both front doors: containers as runtimes report them, and their translation into the
engine's requests. Nothing here knows NRI or the OCI hook; both use it."""

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
