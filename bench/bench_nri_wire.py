"""Round-trip latency of NRI calls through the real wire layer (mux, ttrpc, session).

Run from the repository root:  .venv/bin/python -m bench.bench_nri_wire [--calls N]

One process, one socketpair: the fake runtime of the tests (its own framing code) calls
CreateContainer on an NriSession whose handler answers at once with a cpuset adjustment, so
the figure is the wire layer's cost on both sides plus the thread hand-offs, not the engine's.
The request is shaped like what containerd sends for a Kubernetes container (labels,
annotations, env, mounts, Linux resources). A second, 32 kB request measures the multi-frame
path. The runtime waits 2 s for each answer; the target keeps the wire a small share of that.
"""

from __future__ import annotations

import argparse
import gc
import socket
import statistics
import sys
import threading
import time

from nri_numa.nri.pb import api_pb2
from nri_numa.nri.session import NriSession
from tests.integration.nri.fake_runtime import FakeRuntime

TARGET_P99_MS = 5.0
WARMUP = 50


class TrivialPlugin:
    """Answers every CreateContainer with the same cpuset adjustment."""

    reply = api_pb2.CreateContainerResponse(
        adjust=api_pb2.ContainerAdjustment(
            linux=api_pb2.LinuxContainerAdjustment(
                resources=api_pb2.LinuxResources(cpu=api_pb2.LinuxCPU(cpus="4-7", mems="1"))
            )
        )
    )

    def configure(self, req):
        return api_pb2.ConfigureResponse(events=0x7FF)

    def synchronize(self, req):
        return api_pb2.SynchronizeResponse()

    def create_container(self, req):
        return self.reply

    def update_container(self, req):
        return api_pb2.UpdateContainerResponse()

    def stop_container(self, req):
        return api_pb2.StopContainerResponse()

    def state_change(self, req):
        return None

    def shutdown(self):
        return None


def kubernetes_like_request(env_vars: int, mounts: int) -> api_pb2.CreateContainerRequest:
    uid = "0f4c6a8e-6d2b-4a53-9d53-3b8c1f2e9a71"
    labels = {
        "io.kubernetes.pod.name": "web-7d9f8c6b5-x2x9k",
        "io.kubernetes.pod.namespace": "default",
        "io.kubernetes.pod.uid": uid,
        "app": "web",
        "pod-template-hash": "7d9f8c6b5",
    }
    pod = api_pb2.PodSandbox(
        id="a" * 64, name="web-7d9f8c6b5-x2x9k", uid=uid, namespace="default", labels=labels,
        annotations={"kubernetes.io/config.source": "api", "kubernetes.io/config.seen": "2025-05-20T10:00:00Z"},
        linux=api_pb2.LinuxPodSandbox(cgroup_parent=f"/kubepods/pod{uid}"),
    )
    resources = api_pb2.LinuxResources(
        cpu=api_pb2.LinuxCPU(
            shares=api_pb2.OptionalUInt64(value=4096), quota=api_pb2.OptionalInt64(value=400000),
            period=api_pb2.OptionalUInt64(value=100000), cpus="0-63", mems="0-1",
        ),
        memory=api_pb2.LinuxMemory(limit=api_pb2.OptionalInt64(value=8 << 30)),
        hugepage_limits=[api_pb2.HugepageLimit(page_size="2MB", limit=0)],
    )
    container = api_pb2.Container(
        id="b" * 64, pod_sandbox_id="a" * 64, name="app", state=api_pb2.CONTAINER_CREATED,
        labels={**labels, "io.kubernetes.container.name": "app"},
        annotations={"io.kubernetes.container.hash": "5f1d2e3c", "io.kubernetes.container.restartCount": "0"},
        args=["/app/server", "--port=8080", "--workers=4"],
        env=[f"SERVICE_{i}_PORT=tcp://10.96.{i % 250}.{i % 200}:8080" for i in range(env_vars)],
        mounts=[
            api_pb2.Mount(destination=f"/var/run/secrets/vol{i}", type="bind",
                          source=f"/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~secret/vol{i}",
                          options=["rbind", "rprivate", "ro"])
            for i in range(mounts)
        ],
        linux=api_pb2.LinuxContainer(resources=resources, cgroups_path=f"/kubepods/pod{uid}/{'b' * 64}"),
    )
    return api_pb2.CreateContainerRequest(pod=pod, container=container)


def measure(runtime: FakeRuntime, request: api_pb2.CreateContainerRequest, calls: int) -> list[float]:
    for _ in range(WARMUP):
        runtime.call("CreateContainer", request, api_pb2.CreateContainerResponse)
    samples = []
    gc.disable()
    try:
        for _ in range(calls):
            started = time.perf_counter()
            reply = runtime.call("CreateContainer", request, api_pb2.CreateContainerResponse)
            samples.append((time.perf_counter() - started) * 1000)
    finally:
        gc.enable()
    assert reply.adjust.linux.resources.cpu.cpus == "4-7"
    return samples


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per request size (>= 500)")
    args = parser.parse_args()
    if args.calls < 500:
        parser.error("--calls must be at least 500 for a meaningful p99")

    plugin_end, runtime_end = socket.socketpair()
    runtime = FakeRuntime(runtime_end).start()
    session = NriSession(plugin_end)
    runner = threading.Thread(target=lambda: _run_quietly(session), name="bench-session")
    runner.start()
    if not runtime.registered.wait(5):
        print("FAIL: the session did not register", file=sys.stderr)
        return 1
    runtime.configure()
    runtime.synchronize()

    failed = False
    cases = [("typical", kubernetes_like_request(env_vars=30, mounts=6), True),
             ("large", kubernetes_like_request(env_vars=600, mounts=40), False)]
    for label, request, gated in cases:
        samples = measure(runtime, request, args.calls)
        p50, p99 = statistics.median(samples), percentile(samples, 0.99)
        verdict = ""
        if gated:
            ok = p99 <= TARGET_P99_MS
            failed |= not ok
            verdict = f"  target p99 <= {TARGET_P99_MS:g} ms: {'PASS' if ok else 'FAIL'}"
        print(
            f"CreateContainer round trip, {label} request ({request.ByteSize()} B), {args.calls} calls: "
            f"p50 {p50:.3f} ms  p99 {p99:.3f} ms  max {max(samples):.3f} ms{verdict}"
        )
    frames = [length for conn, length in runtime.received.frames if conn == 1]
    print(f"plugin → runtime frames on conn 1: {len(frames)}, largest payload {max(frames)} B (limit 4096)")
    session.close()
    runner.join(5)
    runtime.close()
    return 1 if failed or max(frames) > 4096 else 0


def _run_quietly(session: NriSession) -> None:
    session.run(TrivialPlugin(), "bench", "10")


if __name__ == "__main__":
    sys.exit(main())
