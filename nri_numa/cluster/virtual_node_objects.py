"""The API objects of a virtual node: a Kubernetes Node without a kubelet whose capacity is a
synthetic machine's (nri_numa/topology/synthetic), its Lease in ``kube-node-lease`` and its
status with a Ready condition. Pure: no I/O; nri_numa/cluster/virtual_nodes.py keeps them
in an API server (docs/scheduler-extender.md, "Trying it without the hardware").

The Node reports what a kubelet on that machine would: every online CPU, the memory of every
NUMA node, the huge pages and the devices whose resource is a valid extended resource name
(``nvidia.com/gpu``), with allocatable less the configuration's reserved CPUs and memory. It
carries a NoSchedule taint, so that only pods that tolerate it (the ones meant for the
experiment) land where nothing will ever run them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from nri_numa import __version__
from nri_numa.engine.config import ConfigError, EngineConfig
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.topology.synthetic.presets import PRESETS, preset_topology

VIRTUAL_LABEL = "numa.nri.io/virtual-node"  # its value: the preset the node is made from
TAINT_KEY = VIRTUAL_LABEL
LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40  # the kubelet's default nodeLeaseDurationSeconds
MAX_PODS = 110  # the kubelet's default maxPods
MAX_NODES = 500  # per keeper: each is a ledger and an API object to keep
# What each virtual node runs unless told otherwise: the kubelet's static CPU policy with whole
# cores, single-numa-node alignment for the whole pod, two CPUs kept for the system.
DEFAULT_CONFIG = {"cpuManagerPolicy": "static",
                  "cpuManagerPolicyOptions": {"full-pcpus-only": "true"},
                  "topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "pod",
                  "kubeReserved": {"cpu": "2"}}
# A qualified name as the API server checks resource names: no ':' (nri-numa's own pci/<vendor>:
# <device> names are asked for by annotation, never as a resource).
_EXTENDED_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class VirtualNodeError(ValueError):
    """A virtual node that cannot be made; the message is one line."""


@dataclass(frozen=True, slots=True)
class VirtualNode:
    name: str
    preset: str
    ctx: EngineContext


def parse_spec(text: str) -> tuple[str, int]:
    """``PRESET`` or ``PRESET=COUNT`` → (preset, count)."""
    preset, _, count = text.partition("=")
    if preset not in PRESETS:
        raise VirtualNodeError(f"{text[:60]!r}: no preset {preset[:40]!r}; `nri-numa presets` "
                               f"lists them ({', '.join(sorted(PRESETS))})")
    if count and not (count.isdigit() and 1 <= int(count) <= MAX_NODES):
        raise VirtualNodeError(f"{text[:60]!r}: the count must be 1 to {MAX_NODES}")
    return preset, int(count or 1)


def virtual_nodes(specs: list[tuple[str, int]], config: EngineConfig,
                  prefix: str = "virtual-") -> tuple[VirtualNode, ...]:
    """Nodes named ``<prefix><preset>-<i>``, one engine context per preset."""
    nodes = []
    for preset, count in specs:
        try:
            ctx = EngineContext.build(preset_topology(preset), config)
        except ConfigError as e:
            raise VirtualNodeError(f"preset {preset}: the configuration does not fit: "
                                   f"{' '.join(str(e).split())[:300]}") from None
        for i in range(count):
            name = f"{prefix}{preset}-{i}"
            if len(name) > 63 or not _NODE_NAME.match(name):
                raise VirtualNodeError(f"node name {name[:80]!r} is not a DNS label: choose "
                                       "another prefix")
            nodes.append(VirtualNode(name, preset, ctx))
    if len({n.name for n in nodes}) != len(nodes):
        raise VirtualNodeError("a preset is named twice: give each once, with its count")
    if len(nodes) > MAX_NODES:
        raise VirtualNodeError(f"{len(nodes)} nodes: at most {MAX_NODES} per keeper")
    return tuple(nodes)


def default_config() -> EngineConfig:
    return config_from_mapping(DEFAULT_CONFIG)


# --- resources --------------------------------------------------------------------------------


def capacity(ctx: EngineContext) -> dict[str, str]:
    topology = ctx.topology
    amounts = {"cpu": str(len(topology.cpus)),
               "memory": str(sum(n.memory_bytes for n in topology.numa_nodes)),
               "pods": str(MAX_PODS)}
    hugepages: dict[int, int] = {}
    for node in topology.numa_nodes:
        for size_kib, pages in node.hugepages.items():
            hugepages[size_kib] = hugepages.get(size_kib, 0) + pages.total * size_kib * 1024
    for size_kib, total in sorted(hugepages.items()):
        amounts[f"hugepages-{_size_name(size_kib)}"] = str(total)
    for name, resource in sorted(ctx.devices.items()):
        if _EXTENDED_NAME.match(name):
            amounts[name] = str(sum(1 for d in resource.devices if d.healthy))
    return amounts


def allocatable(ctx: EngineContext) -> dict[str, str]:
    """Capacity less what the configuration keeps for the system, as the kubelet reports it
    (memory less the huge pages too: they are set aside at boot)."""
    config = ctx.config
    amounts = capacity(ctx)
    amounts["cpu"] = str(len(ctx.topology.cpus) - len(ctx.reserved_cpus))
    kept = config.kube_reserved.get("memory", 0) + config.system_reserved.get("memory", 0)
    kept += sum(int(v) for k, v in amounts.items() if k.startswith("hugepages-"))
    amounts["memory"] = str(max(0, int(amounts["memory"]) - kept))
    return amounts


def _size_name(size_kib: int) -> str:
    return f"{size_kib // (1024 * 1024)}Gi" if size_kib % (1024 * 1024) == 0 else (
        f"{size_kib // 1024}Mi" if size_kib % 1024 == 0 else f"{size_kib}Ki")


# --- objects -----------------------------------------------------------------------------------


def node_object(node: VirtualNode, now: float, *, taint: bool = True) -> dict[str, Any]:
    """The Node as created, status included (the API server keeps a new Node's status, as it
    does the kubelet's registration)."""
    spec: dict[str, Any] = {}
    if taint:
        spec["taints"] = [{"key": TAINT_KEY, "value": node.preset, "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node.name,
                         "labels": {"kubernetes.io/hostname": node.name,
                                    "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                                    VIRTUAL_LABEL: node.preset}},
            "spec": spec, "status": node_status(node, now, since=now)}


def node_status(node: VirtualNode, now: float, since: float) -> dict[str, Any]:
    """Ready since ``since``, heard from at ``now``."""
    heard, began = rfc3339(now), rfc3339(since)

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {"type": kind, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": heard, "lastTransitionTime": began}

    return {
        "capacity": capacity(node.ctx), "allocatable": allocatable(node.ctx),
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "virtual"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "virtual"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "virtual"),
            condition("Ready", "True", "KubeletReady",
                      f"virtual node kept by nri-numa: no kubelet, pods bound here never run "
                      f"(machine: preset {node.preset})"),
        ],
        # Every field is set: clients that read a Node into typed objects require them.
        "nodeInfo": {"machineID": node.name, "systemUUID": node.name, "bootID": node.name,
                     "kernelVersion": "virtual", "osImage": f"nri-numa preset {node.preset}",
                     "containerRuntimeVersion": "none://virtual",
                     "kubeletVersion": f"v0.0.0-nri-numa-{__version__}",
                     "kubeProxyVersion": "none", "operatingSystem": "linux",
                     "architecture": "amd64"},
    }


def heartbeat_patch(node: VirtualNode, now: float, since: float) -> dict[str, Any]:
    """The status patch that keeps the Ready condition fresh (conditions merge by type)."""
    return {"status": {"conditions": node_status(node, now, since)["conditions"]}}


def lease_object(name: str, now: float, node_uid: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": LEASE_NAMESPACE}
    if node_uid:  # as the kubelet does: the lease goes with its Node
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name,
                                        "uid": node_uid}]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS,
                     "renewTime": micro_time(now)}}


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(int(seconds), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(seconds: float) -> str:
    """A MicroTime. Never on a whole second: the kubernetes client reads the body into its
    model and writes it back with isoformat(), which drops a zero fraction, and the API server
    refuses a MicroTime without one."""
    moment = datetime.fromtimestamp(seconds, timezone.utc)
    if moment.microsecond == 0:
        moment = moment.replace(microsecond=1)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
