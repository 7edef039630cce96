"""One pod out of a List reply (pod_heads.py): the answer a full decode gives, from real bytes."""

from __future__ import annotations

import pytest

from nri_numa.podresources.hints import find_container, pods_by_name
from nri_numa.podresources.pb import api_pb2 as pr
from nri_numa.podresources.pod_heads import DecodeError, PodHeads, pods_named


def full_pod(namespace: str, name: str, tag: str) -> pr.PodResources:
    """A pod using every field of the API, so that a field lost on the way shows."""
    memory = pr.ContainerMemory(memory_type="hugepages-1Gi", size=2 << 30,
                                topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=1)]))
    claim = pr.DynamicResource(claim_name="claim", claim_namespace=namespace, claim_resources=[
        pr.ClaimResource(cdi_devices=[pr.CDIDevice(name="vendor.com/gpu=gpu0")],
                         driver_name="gpu.vendor.com", pool_name="pool", device_name="gpu0",
                         share_id="s1")])
    main = pr.ContainerResources(
        name="main", cpu_ids=[4, 5], memory=[memory], dynamic_resources=[claim],
        devices=[pr.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[f"GPU-{tag}"],
                                     topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=1)]))])
    return pr.PodResources(namespace=namespace, name=name,
                           containers=[main, pr.ContainerResources(name="sidecar")])


def reply(*pods: pr.PodResources) -> bytes:
    return pr.ListPodResourcesResponse(pod_resources=pods).SerializeToString()


def listed(body: bytes) -> bytes:
    """``body`` as one pod of a List reply: field 1, its length as a varint, the bytes."""
    length, n = b"", len(body)
    while n > 0x7F:
        length, n = length + bytes([n & 0x7F | 0x80]), n >> 7
    return b"\x0a" + length + bytes([n]) + body


def lookup(data: bytes, namespace: str, pod: str) -> list[pr.PodResources]:
    return list(pods_named(PodHeads.FromString(data), namespace, pod))


def test_the_pod_is_the_one_a_full_decode_gives() -> None:
    pods = [full_pod("ml", f"pod-{i}", str(i)) for i in range(50)]
    data = reply(*pods)
    for i in (0, 17, 49):
        assert lookup(data, "ml", f"pod-{i}") == [pods[i]]
    assert lookup(data, "ml", "pod-50") == [] and lookup(data, "other", "pod-3") == []
    assert lookup(b"", "ml", "pod-0") == []  # a node without pods


def test_pods_of_the_same_name_come_in_the_kubelets_order() -> None:
    # While a StatefulSet's pod is replaced the kubelet can list the old one and the new one.
    old = pr.PodResources(namespace="ml", name="db-0", containers=[
        pr.ContainerResources(name="init")])
    new = full_pod("ml", "db-0", "new")
    data = reply(full_pod("ml", "db-1", "x"), old, full_pod("other", "db-0", "y"), new)
    assert lookup(data, "ml", "db-0") == [old, new]
    heads = PodHeads.FromString(data)
    # ... and find_container keeps its answer: the first of them with the container.
    assert find_container(pods_named(heads, "ml", "db-0"), "ml", "db-0", "main") \
        == new.containers[0]
    assert find_container(pods_named(heads, "ml", "db-0"), "ml", "db-0", "init") \
        == old.containers[0]


def test_any_field_order_and_fields_of_a_newer_kubelet() -> None:
    pod = full_pod("ml", "trainer", "t")
    # Namespace before name, containers in between, and a field 9 this copy of the API lacks:
    # legal protobuf that another encoder may write; field 9 must survive the round trip.
    namespace = pr.PodResources(namespace="ml").SerializeToString()
    name = pr.PodResources(name="trainer").SerializeToString()
    containers = pr.PodResources(containers=pod.containers).SerializeToString()
    unknown = b"\x4a\x03new"  # field 9, length-delimited, "new"
    data = listed(namespace + containers + unknown + name)
    assert len(data) > 130  # a two-byte length
    [found] = lookup(reply(full_pod("ml", "x", "x")) + data, "ml", "trainer")
    assert found.name == "trainer" and found.namespace == "ml"
    assert list(found.containers) == list(pod.containers)
    assert found.SerializeToString().endswith(unknown)
    assert found == pr.ListPodResourcesResponse.FromString(data).pod_resources[0]


def test_a_damaged_pod_is_an_error_only_when_it_is_the_one_asked_for() -> None:
    broken_containers = b"\x1a\x02\xff\xff"  # field 3 holding bytes that are no message
    head = pr.PodResources(namespace="ml", name="broken").SerializeToString()
    data = reply(full_pod("ml", "fine", "f")) + listed(head + broken_containers)
    with pytest.raises(DecodeError):
        pr.ListPodResourcesResponse.FromString(data)  # a full decode refuses it all
    assert lookup(data, "ml", "fine") == [full_pod("ml", "fine", "f")]
    with pytest.raises(DecodeError):
        lookup(data, "ml", "broken")


def test_bytes_that_are_no_list_reply_are_refused() -> None:
    with pytest.raises(DecodeError):
        PodHeads.FromString(b"\xff\xff\xff\xff")
    with pytest.raises(DecodeError):
        PodHeads.FromString(b"\x0a\x05\x0a\x10abc")  # a name longer than its pod


def test_the_index_by_name_answers_as_a_walk_of_all_pods() -> None:
    pods = [full_pod("ml", "a", "1"), pr.PodResources(namespace="ml", name="b"),
            full_pod("ml", "b", "2"), full_pod("x", "a", "3")]
    index = pods_by_name(pods)
    for namespace, name, container in [("ml", "a", "main"), ("ml", "b", "main"),
                                       ("ml", "b", "init"), ("x", "a", "sidecar"),
                                       ("y", "a", "main")]:
        assert find_container(index.get((namespace, name), ()), namespace, name, container) \
            == find_container(pods, namespace, name, container)
    assert [len(v) for v in index.values()] == [1, 2, 1]
