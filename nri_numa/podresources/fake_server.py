"""A fake kubelet PodResources server on a real unix socket, for tests and for trying nri-numa
where no kubelet runs::

    python -m nri_numa.podresources.fake_server --socket /tmp/kubelet.sock --state pods.yaml

It serves ``v1.PodResourcesLister`` (List, GetAllocatableResources, Get) with grpcio, from the
state file described in ``nri_numa.podresources.fake_state``. The file is read again whenever it
changes, so a test or a person can hand out devices while it runs. Errors are the kubelet's
own: a switched-off Get answers UNKNOWN "PodResources API Get method disabled", a kubelet before
1.27 has no Get at all (UNIMPLEMENTED), an unknown pod is UNKNOWN "pod X in namespace Y not found".
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from nri_numa.podresources.fake_state import FakeKubeletState, FakeStateError, read_state_file
from nri_numa.podresources.pb import api_pb2 as pr

SERVICE = "v1.PodResourcesLister"
GARBAGE = b"\xff\xff\xff\xff"  # a truncated varint tag: no protobuf message parses from it


class FakeKubelet:
    """The server; ``state`` may be replaced at any time (tests), or follow ``state_file``."""

    def __init__(self, socket_path: str | Path, state: FakeKubeletState | None = None, *,
                 state_file: Path | None = None, workers: int = 4) -> None:
        self.socket_path = Path(socket_path)
        self.state_file = state_file
        self.state = state or FakeKubeletState()
        self.calls: list[str] = []  # method names in the order they came, unserved ones too
        self._file_stamp: tuple[int, int] | None = None
        self._lock = threading.Lock()
        if state_file is not None:
            self._reload()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                                   handlers=[self._handlers()])

    def start(self) -> FakeKubelet:
        if self.socket_path.is_socket():
            self.socket_path.unlink()  # a socket left by an earlier run
        self._server.add_insecure_port(f"unix://{self.socket_path.absolute()}")
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait(self) -> None:
        self._server.wait_for_termination()

    # --- serving ----------------------------------------------------------------------------

    def _handlers(self) -> grpc.GenericRpcHandler:
        def handler(method, request_type, answer):  # noqa: ANN001, ANN202
            return grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: self._serve(method, req, ctx, answer),
                request_deserializer=request_type.FromString,
                response_serializer=self._serialize)

        return _FakeHandlers({
            "List": handler("List", pr.ListPodResourcesRequest, self._list),
            "GetAllocatableResources": handler("GetAllocatableResources",
                                               pr.AllocatableResourcesRequest, self._allocatable),
            "Get": handler("Get", pr.GetPodResourcesRequest, self._get),
        }, self._arrived)

    def _arrived(self, method: str) -> bool:
        """Note a call; False when this kubelet has no such method (Get before 1.27)."""
        with self._lock:
            self.calls.append(method)
        return method != "Get" or self._current().get != "unimplemented"

    def _serve(self, method, request, context, answer):  # noqa: ANN001, ANN202
        state = self._current()
        if state.delay_s:
            time.sleep(state.delay_s)
        return answer(state, request, context)

    def _serialize(self, reply) -> bytes:  # noqa: ANN001
        return GARBAGE if self._current().garbage else reply.SerializeToString()

    @staticmethod
    def _list(state: FakeKubeletState, request, context):  # noqa: ANN001, ANN205
        return state.list_reply

    @staticmethod
    def _allocatable(state: FakeKubeletState, request, context):  # noqa: ANN001, ANN205
        return state.allocatable

    @staticmethod
    def _get(state: FakeKubeletState, request, context):  # noqa: ANN001, ANN205
        if state.get == "disabled":
            context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        pod = state.pod(request.pod_namespace, request.pod_name)
        if pod is None:
            context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace "
                                                   f"{request.pod_namespace} not found")
        return pr.GetPodResourcesResponse(pod_resources=pod)

    def _current(self) -> FakeKubeletState:
        if self.state_file is not None:
            self._reload()
        return self.state

    def _reload(self) -> None:
        """Read the state file again when it changed; a broken edit keeps the last good state."""
        assert self.state_file is not None
        try:
            st = self.state_file.stat()
        except OSError as e:
            if self._file_stamp is None:
                raise FakeStateError(f"{self.state_file}: {e.strerror}") from None
            return  # removed while serving: keep what it said
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            if stamp == self._file_stamp:
                return
            try:
                self.state = read_state_file(self.state_file)
            except FakeStateError as e:
                if self._file_stamp is None:
                    raise
                print(f"fake kubelet: keeping the last state: {e}", file=sys.stderr)
            self._file_stamp = stamp


class _FakeHandlers(grpc.GenericRpcHandler):
    """The service's methods. ``arrived(method)`` says whether this kubelet has the method;
    when it has not, gRPC answers UNIMPLEMENTED as it would for a method the server never had."""

    def __init__(self, methods: dict[str, grpc.RpcMethodHandler], arrived) -> None:  # noqa: ANN001
        self._methods = methods
        self._arrived = arrived

    def service(self, handler_call_details):  # noqa: ANN001, ANN201
        service, _, method = handler_call_details.method.lstrip("/").partition("/")
        if service != SERVICE or not self._arrived(method):
            return None
        return self._methods.get(method)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nri_numa.podresources.fake_server",
        description="Serve the kubelet's PodResources API from a state file, until stopped.")
    parser.add_argument("--socket", required=True, metavar="PATH", help="the unix socket to serve")
    parser.add_argument("--state", required=True, metavar="FILE",
                        help="pods and devices in YAML or JSON (see nri_numa.podresources.fake_state)")
    args = parser.parse_args(argv)
    try:
        kubelet = FakeKubelet(args.socket, state_file=Path(args.state))
        kubelet.start()
    except (FakeStateError, RuntimeError) as e:
        print(f"fake kubelet: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"fake kubelet: serving {SERVICE} on {args.socket} (pid {os.getpid()})",
          file=sys.stderr, flush=True)
    while not stop.wait(0.5):
        pass
    kubelet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
