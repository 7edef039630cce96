"""Well-formed NRI messages carrying odd values: lists that are not lists or name CPU 4294967295,
hugepage sizes that are not sizes, extreme shares, quotas and limits, devices of no type, empty
names, cgroup parents and annotations that mean nothing. A runtime should never send them; the
plugin must answer each with an error naming the value, or place the container, never fail
otherwise. Seeded: the same ``random.Random`` gives the same messages."""

from __future__ import annotations

import random

from nri_numa.nri.pb import api_pb2 as api
from tests import nri_messages as msg

STRINGS = ("", "0", "1", "0-1", "1-0", "-1", "a", "0,,1", ",", "-", "99", "0-4294967295",
           "0-65536", "0-99999999:1", "00000001", "9" * 5000, "2MB", "1GB", "0MB", "3KB",
           "1023B", "1e9", "\x00", "é", "numa.nri.io/topology-policy", "single-numa-node", "pod",
           "/kubepods/podX", "/kubepods/burstable/pod1", "kubepods-pod1.slice")
SIGNED = (0, 1, 2, -1, -2, 1023, 1024, 100_000, 2**31, 2**63 - 1, -(2**63))
UNSIGNED = (0, 1, 2, 1023, 1024, 100_000, 2**32, 2**64 - 1)
ANNOTATIONS = ("numa.nri.io/topology-policy", "numa.nri.io/topology-scope", "numa.nri.io/x",
               "other")
ENV = ("NVIDIA_VISIBLE_DEVICES=", "NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=all,GPU-x",
       "=x", "NVIDIA_VISIBLE_DEVICES=-1")


def _maybe(rng: random.Random, p: float) -> bool:
    return rng.random() < p


def odd_pod(rng: random.Random) -> api.PodSandbox:
    pod = msg.pod(f"p{rng.randrange(5)}", rng.choice(["guaranteed", "burstable", "besteffort"]))
    for attr in ("id", "uid", "name"):
        if _maybe(rng, 0.15):
            setattr(pod, attr, rng.choice(STRINGS))
    if _maybe(rng, 0.3):
        pod.linux.cgroup_parent = rng.choice(STRINGS)
    for _ in range(rng.randint(0, 2)):
        pod.annotations[rng.choice(ANNOTATIONS)] = rng.choice(STRINGS)
    return pod


def odd_container(rng: random.Random, pod: api.PodSandbox) -> api.Container:
    millis = rng.choice([0, 500, 1000, 2000, 3000])
    c = msg.container(pod, rng.choice(["a", "b", ""]), cpu=millis,
                      cpu_limit=rng.choice([0, millis]), memory=rng.choice([0, 1 << 26]),
                      state=rng.choice([0, 1, 2, 3, 4, 7]), pid=rng.choice([0, 5, 99]))
    resources = c.linux.resources
    if _maybe(rng, 0.3):
        resources.cpu.shares.value = rng.choice(UNSIGNED)
    if _maybe(rng, 0.3):
        resources.cpu.quota.value = rng.choice(SIGNED)
    if _maybe(rng, 0.3):
        resources.cpu.period.value = rng.choice(UNSIGNED)
    if _maybe(rng, 0.3):
        resources.memory.limit.value = rng.choice(SIGNED)
    if _maybe(rng, 0.3):
        resources.cpu.cpus = rng.choice(STRINGS)
    if _maybe(rng, 0.3):
        resources.cpu.mems = rng.choice(STRINGS)
    if _maybe(rng, 0.3):
        resources.hugepage_limits.add(page_size=rng.choice(STRINGS), limit=rng.choice(UNSIGNED))
    if _maybe(rng, 0.2):
        c.linux.devices.add(path=rng.choice(STRINGS), type=rng.choice(["c", "b", "x", ""]),
                            major=rng.choice(SIGNED), minor=rng.choice(SIGNED))
    if _maybe(rng, 0.2):
        c.env.append(rng.choice(ENV))
    if _maybe(rng, 0.15):
        c.id = rng.choice(STRINGS)
    return c


def odd_event(rng: random.Random) -> tuple[str, object]:
    """(method, request) for one of the plugin's event methods, Synchronize included."""
    pod = odd_pod(rng)
    container = odd_container(rng, pod)
    kind = rng.random()
    if kind < 0.5:
        return "CreateContainer", api.CreateContainerRequest(pod=pod, container=container)
    if kind < 0.6:
        return "UpdateContainer", api.UpdateContainerRequest(pod=pod, container=container)
    if kind < 0.7:
        return "StopContainer", api.StopContainerRequest(pod=pod, container=container)
    if kind < 0.8:
        event = rng.choice([api.RUN_POD_SANDBOX, api.STOP_POD_SANDBOX, api.REMOVE_POD_SANDBOX,
                            api.REMOVE_CONTAINER])
        return "StateChange", msg.event(event, pod, container)
    pods = [odd_pod(rng) for _ in range(3)]
    containers = [odd_container(rng, rng.choice(pods)) for _ in range(4)]
    return "Synchronize", api.SynchronizeRequest(pods=pods, containers=containers)
