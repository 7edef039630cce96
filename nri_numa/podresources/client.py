"""A gRPC client of the kubelet's PodResources API on its unix socket.

Like the kubelet's own client (k8s.io/kubernetes pkg/kubelet/apis/podresources/client.go): an
insecure channel over the unix socket and a 16 MiB limit on messages (a List of a full node can
be large). Unlike it, every call has a short deadline, because the plugin calls it while the
runtime waits for an answer (2 s for the whole CreateContainer). Failures become
``PodResourcesError`` carrying gRPC's status code, so callers can tell an old kubelet
(no ``Get``) from a kubelet that is down.
"""

from __future__ import annotations

import os

import grpc

from nri_numa.podresources.hints import find_container
from nri_numa.podresources.pb import api_pb2 as pr
from nri_numa.podresources.pb import api_pb2_grpc as pr_grpc
from nri_numa.podresources.pod_heads import DecodeError, PodHeads, pods_named
from nri_numa.safeio.bounds import clip

MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # the kubelet client's defaultPodResourcesMaxSize
DEFAULT_TIMEOUT_S = 0.1

# What a kubelet answers Get with when the KubeletPodResourcesGet gate is off: a plain Go error,
# which gRPC sends as UNKNOWN with this text (server_v1.go).
GET_DISABLED_TEXT = "PodResources API Get method disabled"


class PodResourcesError(Exception):
    """A PodResources call failed; ``code`` is gRPC's status code (None: no answer at all)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code

    @property
    def get_unsupported(self) -> bool:
        """The kubelet has no Get (before 1.27) or has it switched off (feature gate)."""
        return self.code is grpc.StatusCode.UNIMPLEMENTED or (
            self.code is grpc.StatusCode.UNKNOWN and GET_DISABLED_TEXT in str(self))


class PodResourcesClient:
    """One channel to the kubelet, kept for the agent's life; each call opens nothing new.

    gRPC connects lazily and reconnects by itself after the kubelet restarts.
    """

    def __init__(self, socket_path: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not socket_path:
            raise ValueError("PodResources socket path is empty")
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            "unix://" + os.path.abspath(socket_path),
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.enable_http_proxy", 0)])
        self._stub = pr_grpc.PodResourcesListerStub(self._channel)
        # List as list_container reads it: only the pods' names decoded (pod_heads.py).
        self._list_heads = self._channel.unary_unary(
            "/v1.PodResourcesLister/List",
            request_serializer=pr.ListPodResourcesRequest.SerializeToString,
            response_deserializer=PodHeads.FromString, _registered_method=True)

    def close(self) -> None:
        self._channel.close()

    def wait_ready(self, timeout_s: float) -> None:
        """Connect now rather than on the first call; PodResourcesError when the kubelet does
        not accept within ``timeout_s``."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise PodResourcesError(f"kubelet PodResources at {self.socket_path}: not connected "
                                    f"within {timeout_s:g} s",
                                    grpc.StatusCode.UNAVAILABLE) from None

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def list(self, timeout_s: float | None = None) -> list[pr.PodResources]:
        reply = self._call("List", self._stub.List, pr.ListPodResourcesRequest(), timeout_s)
        return list(reply.pod_resources)

    def list_container(self, namespace: str, pod: str, container: str,
                       timeout_s: float | None = None) -> pr.ContainerResources | None:
        """``List``, keeping only the entry of ``container`` in pod ``namespace/pod`` (None when
        the kubelet lists none), as ``hints.find_container`` finds it; the other pods are not
        decoded (pod_heads.py), which is most of a big node's reply."""
        heads = self._call("List", self._list_heads, pr.ListPodResourcesRequest(), timeout_s)
        try:
            return find_container(pods_named(heads, namespace, pod), namespace, pod, container)
        except DecodeError as e:
            raise PodResourcesError(f"PodResources List on {self.socket_path}: pod "
                                    f"{namespace}/{pod} is not a PodResources message: {e}",
                                    grpc.StatusCode.INTERNAL) from None

    def get(self, namespace: str, pod: str, timeout_s: float | None = None) -> pr.PodResources:
        reply = self._call("Get", self._stub.Get,
                           pr.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace),
                           timeout_s)
        return reply.pod_resources

    def allocatable(self, timeout_s: float | None = None) -> pr.AllocatableResourcesResponse:
        return self._call("GetAllocatableResources", self._stub.GetAllocatableResources,
                          pr.AllocatableResourcesRequest(), timeout_s)

    def _call(self, method: str, stub_call, request,  # noqa: ANN001
              timeout_s: float | None):  # noqa: ANN202
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise PodResourcesError(f"PodResources {method}: no time left for the call",
                                    grpc.StatusCode.DEADLINE_EXCEEDED)
        try:
            return stub_call(request, timeout=timeout)
        except grpc.RpcError as e:
            code = e.code() if callable(getattr(e, "code", None)) else None
            detail = e.details() if callable(getattr(e, "details", None)) else str(e)
            # The kubelet's text, cut to one short line: it goes into the agent's log.
            raise PodResourcesError(
                f"PodResources {method} on {self.socket_path}: "
                f"{code.name if code else 'failed'}: {clip(str(detail), 200)}", code) from None
