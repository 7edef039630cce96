"""The baseline plugin process for bench_nri_plugin: the same session and wire as `nri-numa run`,
handlers that do nothing. CreateContainer is answered with an empty adjustment, so a call's
round trip through it is the cost of the wire, the framing and the protobuf on both sides.

    .venv/bin/python -m bench.empty_plugin SOCKET
"""

from __future__ import annotations

import sys

from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.session import NriSession, SessionClosed


class EmptyPlugin:
    def configure(self, req: api.ConfigureRequest) -> api.ConfigureResponse:
        return api.ConfigureResponse(events=0x7FF)

    def synchronize(self, req: api.SynchronizeRequest) -> api.SynchronizeResponse:
        return api.SynchronizeResponse()

    def create_container(self, req: api.CreateContainerRequest) -> api.CreateContainerResponse:
        return api.CreateContainerResponse()

    def update_container(self, req: api.UpdateContainerRequest) -> api.UpdateContainerResponse:
        return api.UpdateContainerResponse()

    def stop_container(self, req: api.StopContainerRequest) -> api.StopContainerResponse:
        return api.StopContainerResponse()

    def state_change(self, req: api.StateChangeEvent) -> None:
        return None

    def shutdown(self) -> None:
        return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.empty_plugin SOCKET", file=sys.stderr)
        return 2
    try:
        NriSession.connect(argv[0]).run(EmptyPlugin(), "bench-empty", "90")
    except SessionClosed:
        pass  # the bench closed the connection: done
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
