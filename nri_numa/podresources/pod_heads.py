"""One pod out of the kubelet's ``List`` reply, without decoding all the others.

``List`` answers every pod on the node (25 kB for 250 pods holding a GPU each) and the plugin
wants one of them. Decoding the whole reply, copying its ``PodResources`` into a list and
walking them is work done nearly all for pods thrown away.

``PodHeads`` reads the same bytes through a schema that declares only what a pod is found by:
``ListPodResourcesResponse.pod_resources`` (1) → ``PodResources.name`` (1) and ``namespace``
(2). The protobuf runtime (in C with its upb backend) parses that and keeps everything else of each pod (its
containers, and whatever a newer kubelet adds) as unknown fields: bytes it checks for framing
but does not decode. A pod that matches is written back, its name and namespace and those
bytes, which is the pod as the kubelet sent it, and decoded in full as a ``PodResources``
(bench/bench_podresources.py times both). The answer is the one a full decode gives, in any
field order; one difference: a damaged pod *other* than the one asked about is not noticed.
"""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from nri_numa.podresources.pb import api_pb2 as pr

_PACKAGE = "nri_numa.podresources.heads"  # a private pool: nothing clashes with the kubelet's v1


def _schema() -> type[Message]:
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="nri_numa/podresources/heads.proto",
                                               package=_PACKAGE, syntax="proto3")
    head = proto.message_type.add(name="PodHead")
    head.field.add(name="name", number=pr.PodResources.NAME_FIELD_NUMBER,
                   type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    head.field.add(name="namespace", number=pr.PodResources.NAMESPACE_FIELD_NUMBER,
                   type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    heads = proto.message_type.add(name="PodHeads")
    heads.field.add(name="pod_resources",
                    number=pr.ListPodResourcesResponse.POD_RESOURCES_FIELD_NUMBER,
                    type=field.TYPE_MESSAGE, type_name=f".{_PACKAGE}.PodHead",
                    label=field.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.PodHeads"))


PodHeads = _schema()


def pods_named(heads: Message, namespace: str, pod: str) -> Iterator[pr.PodResources]:
    """The pods named ``namespace/pod`` in a ``PodHeads`` (the kubelet's List), in its order,
    each decoded in full when it is reached. DecodeError when such a pod's own bytes are not a
    ``PodResources``."""
    for head in heads.pod_resources:
        if head.name == pod and head.namespace == namespace:  # the name is the rarer match
            yield pr.PodResources.FromString(head.SerializeToString())


__all__ = ["DecodeError", "PodHeads", "pods_named"]
