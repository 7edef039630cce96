"""The PodResources client and hint source against the fake kubelet on a real unix socket."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nri_numa.podresources.client import PodResourcesClient, PodResourcesError
from nri_numa.podresources.fake_server import FakeKubelet
from nri_numa.podresources.fake_state import FakeKubeletState, state_from_mapping
from nri_numa.podresources.source import KubeletDeviceHints
from tests.integration.nri.plugin_env import GPU_ON_NODE_1, machine

REPO = Path(__file__).resolve().parents[3]
GPU = "nvidia.com/gpu"
STATE = {
    "pods": [
        {"namespace": "ml", "name": "trainer", "containers": [
            {"name": "main", "devices": [{"resource": GPU, "ids": [GPU_ON_NODE_1], "numa": [1]}],
             "cpus": [4, 5]},
            {"name": "sidecar"}]},
        {"namespace": "ml", "name": "no-topology", "containers": [
            {"name": "main", "devices": [{"resource": GPU, "ids": [GPU_ON_NODE_1]}]}]},
    ],
    "allocatable": {"devices": [{"resource": GPU, "ids": [GPU_ON_NODE_1], "numa": [1]}],
                    "cpus": [1, 2, 3, 4, 5, 6, 7]},
}


def state(**changes) -> FakeKubeletState:
    return state_from_mapping({**STATE, **changes})


@pytest.fixture
def kubelet(scratch: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(scratch / "kubelet.sock", state()) as server:
        yield server


def source(path: Path, **options) -> KubeletDeviceHints:
    """A hint source with a budget no loaded test machine runs past, unless a test sets one."""
    return KubeletDeviceHints(str(path), machine(), **{"budget_s": 10.0, **options})


# --- the client ---------------------------------------------------------------------------------


def test_list_get_and_allocatable(kubelet: FakeKubelet) -> None:
    with PodResourcesClient(str(kubelet.socket_path)) as client:
        pods = client.list()
        assert [(p.namespace, p.name) for p in pods] == [("ml", "trainer"), ("ml", "no-topology")]
        trainer = client.get("ml", "trainer")
        assert [c.name for c in trainer.containers] == ["main", "sidecar"]
        main = trainer.containers[0]
        assert list(main.devices[0].device_ids) == [GPU_ON_NODE_1] and list(main.cpu_ids) == [4, 5]
        allocatable = client.allocatable()
        assert list(allocatable.cpu_ids) == [1, 2, 3, 4, 5, 6, 7]
        assert allocatable.devices[0].topology.nodes[0].ID == 1
    assert kubelet.calls == ["List", "Get", "GetAllocatableResources"]


def test_list_container_decodes_only_the_pod_asked_for(kubelet: FakeKubelet) -> None:
    with PodResourcesClient(str(kubelet.socket_path)) as client:
        main = client.list_container("ml", "trainer", "main")
        assert main == client.list()[0].containers[0]
        assert client.list_container("ml", "trainer", "absent") is None
        assert client.list_container("ml", "ghost", "main") is None
        assert client.list_container("other", "trainer", "main") is None
    assert kubelet.calls == ["List", "List", "List", "List", "List"]


def test_list_container_names_a_damaged_reply(kubelet: FakeKubelet) -> None:
    kubelet.state = state(garbage=True)
    with PodResourcesClient(str(kubelet.socket_path)) as client, \
            pytest.raises(PodResourcesError) as raised:
        client.list_container("ml", "trainer", "main")
    assert raised.value.code is grpc.StatusCode.INTERNAL


def test_get_of_an_unknown_pod_is_the_kubelets_error(kubelet: FakeKubelet) -> None:
    with PodResourcesClient(str(kubelet.socket_path)) as client, \
            pytest.raises(PodResourcesError) as raised:
        client.get("ml", "ghost")
    assert raised.value.code is grpc.StatusCode.UNKNOWN and not raised.value.get_unsupported
    assert "pod ghost in namespace ml not found" in str(raised.value)


@pytest.mark.parametrize("mode, code", [("unimplemented", grpc.StatusCode.UNIMPLEMENTED),
                                        ("disabled", grpc.StatusCode.UNKNOWN)])
def test_a_kubelet_without_get_is_recognised(kubelet: FakeKubelet, mode: str, code) -> None:
    kubelet.state = state(get=mode)
    with PodResourcesClient(str(kubelet.socket_path)) as client, \
            pytest.raises(PodResourcesError) as raised:
        client.get("ml", "trainer")
    assert raised.value.code is code and raised.value.get_unsupported


def test_a_missing_socket_is_unavailable(scratch: Path) -> None:
    with PodResourcesClient(str(scratch / "absent.sock"), timeout_s=0.2) as client, \
            pytest.raises(PodResourcesError) as raised:
        client.list()
    assert raised.value.code is grpc.StatusCode.UNAVAILABLE
    assert "absent.sock" in str(raised.value)


def test_a_hanging_kubelet_costs_one_deadline(kubelet: FakeKubelet) -> None:
    kubelet.state = state(delay=2.0)
    with PodResourcesClient(str(kubelet.socket_path), timeout_s=0.1) as client:
        start = time.monotonic()
        with pytest.raises(PodResourcesError) as raised:
            client.list()
        took = time.monotonic() - start
    assert raised.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.09 <= took < 1.5


def test_the_client_connects_when_asked(kubelet: FakeKubelet, scratch: Path) -> None:
    with PodResourcesClient(str(kubelet.socket_path)) as client:
        client.wait_ready(10)
        assert kubelet.calls == []  # connected, nothing asked yet
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deaf.bind(str(scratch / "deaf.sock"))  # bound, never listening: connections are refused
    try:
        with PodResourcesClient(str(scratch / "deaf.sock")) as client, \
                pytest.raises(PodResourcesError, match="not connected within 0.3 s") as raised:
            client.wait_ready(0.3)
        assert raised.value.code is grpc.StatusCode.UNAVAILABLE
    finally:
        deaf.close()


def test_warm_up_connects_and_a_deaf_kubelet_only_warns(kubelet: FakeKubelet, scratch: Path,
                                                        caplog) -> None:
    source(kubelet.socket_path).warm_up()
    assert kubelet.calls == [] and "not ready" not in caplog.text
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deaf.bind(str(scratch / "deaf.sock"))
    try:
        with caplog.at_level(logging.WARNING):
            source(scratch / "deaf.sock").warm_up(timeout_s=0.3)
        assert "kubelet PodResources client not ready" in caplog.text
    finally:
        deaf.close()


def test_garbage_replies_are_an_error_not_a_crash(kubelet: FakeKubelet) -> None:
    kubelet.state = state(garbage=True)
    with PodResourcesClient(str(kubelet.socket_path)) as client, \
            pytest.raises(PodResourcesError) as raised:
        client.get("ml", "trainer")
    assert raised.value.code is grpc.StatusCode.INTERNAL


def test_replies_up_to_16_mib_are_taken(kubelet: FakeKubelet) -> None:
    # gRPC's default limit is 4 MiB; the kubelet's client allows 16 MiB, a big node's List.
    ids = [f"GPU-{i:040d}" for i in range(120_000)]  # about 5.5 MiB
    kubelet.state = state(pods=[{"name": "big", "containers": [
        {"name": "c", "devices": [{"resource": GPU, "ids": ids}]}]}])
    with PodResourcesClient(str(kubelet.socket_path), timeout_s=5) as client:
        [big] = client.list()
    assert len(big.containers[0].devices[0].device_ids) == 120_000


def test_an_empty_socket_path_is_refused() -> None:
    with pytest.raises(ValueError, match="socket path is empty"):
        PodResourcesClient("")
    with pytest.raises(ValueError, match="socket path is empty"):
        KubeletDeviceHints("", machine())


# --- the hint source ----------------------------------------------------------------------------


def test_hints_from_get_with_the_kubelets_topology(kubelet: FakeKubelet) -> None:
    hints = source(kubelet.socket_path)
    assert hints("ml", "trainer", "main") == {GPU: {1}}
    assert hints("ml", "trainer", "sidecar") == {}
    assert hints("ml", "trainer", "absent") == {}
    assert kubelet.calls == ["Get", "Get", "Get"]


def test_hints_from_the_machine_when_the_kubelet_gives_no_topology(kubelet: FakeKubelet) -> None:
    assert source(kubelet.socket_path)("ml", "no-topology", "main") == {GPU: {1}}


def test_a_pod_the_kubelet_does_not_run_has_no_hints_and_no_fallback(kubelet: FakeKubelet) -> None:
    hints = source(kubelet.socket_path)
    assert hints("default", "not-kubernetes", "main") == {}
    assert hints("ml", "trainer", "main") == {GPU: {1}}  # not held against the next container
    assert kubelet.calls == ["Get", "Get"]


@pytest.mark.parametrize("mode", ["unimplemented", "disabled"])
def test_without_get_the_source_lists_and_stops_asking_get(kubelet: FakeKubelet, mode) -> None:
    kubelet.state = state(get=mode)
    hints = source(kubelet.socket_path)
    assert hints("ml", "trainer", "main") == {GPU: {1}}
    assert hints("ml", "no-topology", "main") == {GPU: {1}}
    assert kubelet.calls == ["Get", "List", "List"]


@pytest.mark.parametrize("mode", ["enabled", "unimplemented"])
def test_one_list_answers_every_container_of_its_block(kubelet: FakeKubelet, mode) -> None:
    kubelet.state = state(get=mode)
    hints = source(kubelet.socket_path)
    with hints.one_list():
        assert hints("ml", "trainer", "main") == {GPU: {1}}
        kubelet.state = state(get=mode, pods=[])  # the kubelet's answer changes ...
        assert hints("ml", "no-topology", "main") == {GPU: {1}}  # ... the block's does not
        assert hints("ml", "trainer", "sidecar") == {}
        assert hints("ml", "ghost", "main") == {}
        with hints.one_list():  # nested: the same answer
            assert hints("ml", "trainer", "main") == {GPU: {1}}
        assert hints("ml", "trainer", "main") == {GPU: {1}}
    assert kubelet.calls == ["List"]
    # Outside the block every container is asked afresh, and sees the change.
    assert hints("ml", "trainer", "main") == {}
    assert kubelet.calls[1:] == (["Get"] if mode == "enabled" else ["Get", "List"])


def test_one_list_serves_only_the_thread_that_opened_it(kubelet: FakeKubelet) -> None:
    hints = source(kubelet.socket_path)
    seen: list[dict] = []
    with hints.one_list():
        assert hints("ml", "trainer", "main") == {GPU: {1}}
        other = threading.Thread(target=lambda: seen.append(hints("ml", "trainer", "main")))
        other.start()
        other.join(30)
    assert seen == [{GPU: {1}}] and kubelet.calls == ["List", "Get"]


def test_a_failed_list_in_one_list_costs_one_call(kubelet: FakeKubelet, caplog) -> None:
    kubelet.state = state(garbage=True)
    hints = source(kubelet.socket_path, quiet_after_failure_s=10)
    with caplog.at_level(logging.WARNING), hints.one_list():
        for _ in range(5):
            assert hints("ml", "trainer", "main") == {}
    assert kubelet.calls == ["List"]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_one_list_lists_nothing_when_nothing_is_asked(kubelet: FakeKubelet) -> None:
    hints = source(kubelet.socket_path)
    with hints.one_list():
        pass
    assert hints("ml", "trainer", "main") == {GPU: {1}}
    assert kubelet.calls == ["Get"]


def test_get_is_asked_again_after_a_while(kubelet: FakeKubelet) -> None:
    now = [100.0]
    kubelet.state = state(get="disabled")
    hints = source(kubelet.socket_path, recheck_get_s=300, clock=lambda: now[0])
    hints("ml", "trainer", "main")
    kubelet.state = state()  # the kubelet was upgraded or its gate turned on
    now[0] += 301
    assert hints("ml", "trainer", "main") == {GPU: {1}}
    assert kubelet.calls == ["Get", "List", "Get"]


def test_no_socket_no_calls_and_no_grpc(scratch: Path) -> None:
    hints = source(scratch / "absent.sock")
    assert hints("ml", "trainer", "main") == {}
    assert hints._client is None  # nothing was dialled


def test_the_socket_appearing_later_is_used(scratch: Path) -> None:
    hints = source(scratch / "kubelet.sock")
    assert hints("ml", "trainer", "main") == {}
    with FakeKubelet(scratch / "kubelet.sock", state()):
        assert hints("ml", "trainer", "main") == {GPU: {1}}


def test_a_hanging_kubelet_costs_one_budget_then_is_left_alone(kubelet: FakeKubelet, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="nri_numa.podresources.source")
    now = [0.0]
    kubelet.state = state(delay=2.0)
    hints = source(kubelet.socket_path, budget_s=0.1, quiet_after_failure_s=10,
                   clock=lambda: now[0] + time.monotonic())
    start = time.monotonic()
    assert hints("ml", "trainer", "main") == {}
    assert time.monotonic() - start < 1.5
    for _ in range(20):  # a Synchronize adopting many containers: no further waits
        assert hints("ml", "trainer", "main") == {}
    assert time.monotonic() - start < 1.5
    assert kubelet.calls == ["Get"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "DEADLINE_EXCEEDED" in warnings[0].getMessage()
    # Later the kubelet answers again: hints come back, and the log says so once.
    kubelet.state = state()
    now[0] += 11
    time.sleep(2.0)  # let the hung handler finish so the fake serves promptly
    hints._budget_s = 10.0  # what is tested now is the recovery, not the budget
    assert hints("ml", "trainer", "main") == {GPU: {1}}
    assert any("answers again" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("change", [{"garbage": True}])
def test_garbage_gives_no_hints(kubelet: FakeKubelet, change) -> None:
    kubelet.state = state(**change)
    assert source(kubelet.socket_path)("ml", "trainer", "main") == {}


def test_failures_are_logged_once_until_the_kubelet_recovers(scratch: Path, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="nri_numa.podresources.source")
    path = scratch / "kubelet.sock"
    path.write_text("")  # exists, but nobody listens: every call fails at once
    hints = source(path, quiet_after_failure_s=0)
    for _ in range(5):
        assert hints("ml", "trainer", "main") == {}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "placing without the kubelet's device hints" in \
        warnings[0].getMessage()


# --- the fake server as a program ------------------------------------------------------------


def test_the_fake_server_runs_from_the_command_line(scratch: Path) -> None:
    state_file, sock = scratch / "state.yaml", scratch / "k.sock"
    state_file.write_text("pods: [{name: a, containers: [{name: c}]}]\n")
    server = subprocess.Popen(
        [sys.executable, "-m", "nri_numa.podresources.fake_server", "--socket", str(sock),
         "--state", str(state_file)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE, text=True)
    try:
        assert "serving v1.PodResourcesLister" in server.stderr.readline()
        with PodResourcesClient(str(sock), timeout_s=5) as client:
            assert [p.name for p in client.list()] == ["a"]
            state_file.write_text("pods: [{name: b, containers: [{name: c}]}]\nget: unimplemented\n")
            assert [p.name for p in client.list()] == ["b"]  # the file is read again
            with pytest.raises(PodResourcesError) as raised:
                client.get("default", "b")
            assert raised.value.code is grpc.StatusCode.UNIMPLEMENTED
        server.terminate()
        assert server.wait(10) == 0
        assert not sock.exists()
    finally:
        if server.poll() is None:
            server.kill()


def test_the_fake_server_names_a_bad_state_file(scratch: Path) -> None:
    (scratch / "bad.yaml").write_text("pods: 3\n")
    done = subprocess.run(
        [sys.executable, "-m", "nri_numa.podresources.fake_server", "--socket",
         str(scratch / "k.sock"), "--state", str(scratch / "bad.yaml")],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=30)
    assert done.returncode == 2 and "bad.yaml: pods must be a list, not int" in done.stderr


def test_grpc_is_not_imported_by_the_agent_until_the_socket_exists() -> None:
    code = ("import sys, nri_numa.nri.daemon, nri_numa.cli; "
            "assert 'grpc' not in sys.modules, 'grpc imported'")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=30)
    assert done.returncode == 0, done.stderr
