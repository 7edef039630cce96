"""The agent's /metrics server on a real socket: scraped with urllib, answering other paths and
methods with their status, and never held up or taken down by a client that sends garbage,
too much, too little or nothing at all."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nri_numa.agent import metrics_http
from nri_numa.agent.metrics import MetricsError, MetricsServer, PluginMetrics
from nri_numa.agent.settings import MetricsAddress
from tests.polling import until

SCRAPE_TIMEOUT_S = 2.0  # each scrape here answers in milliseconds; a blocked one fails fast


def no_ledger():
    raise RuntimeError("no ledger in these tests")


def counted() -> PluginMetrics:
    metrics = PluginMetrics(no_ledger)
    metrics.admission_requests.inc(3)
    metrics.stale_choices.inc()
    return metrics


@pytest.fixture
def metrics() -> PluginMetrics:
    return counted()


@pytest.fixture(scope="module")
def server() -> Iterator[MetricsServer]:
    """One server for the tests that only scrape it: stopping one takes socketserver's 0.5 s."""
    server = MetricsServer(counted(), MetricsAddress("127.0.0.1", 0))
    try:
        yield server
    finally:
        server.stop()


def port_of(server: MetricsServer) -> int:
    return int(server.url.rsplit(":", 1)[1].split("/")[0])


def scrape(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=SCRAPE_TIMEOUT_S) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def counters(body: bytes) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(body.decode())
            for s in f.samples if not s.labels}


def raw(server: MetricsServer, data: bytes) -> bytes:
    """What the server answers to these bytes, up to its closing the connection."""
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=5) as sock:
        sock.sendall(data)
        return b"".join(iter(lambda: sock.recv(65536), b""))


def test_get_metrics_is_the_exposition(server: MetricsServer):
    status, headers, body = scrape(server.url)
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert headers["Content-Length"] == str(len(body))
    assert headers["Connection"] == "close"
    got = counters(body)
    assert got["nri_numa_topology_manager_admission_requests_total"] == 3
    assert got["nri_numa_scheduled_numa_nodes_stale_total"] == 1
    assert got["nri_numa_topology_manager_admission_duration_ms_count"] == 0


def test_head_has_the_headers_and_no_body(server: MetricsServer):
    _, _, body = scrape(server.url)
    status, headers, head_body = scrape(server.url, "HEAD")
    assert (status, head_body) == (200, b"")
    assert headers["Content-Length"] == str(len(body))


def test_a_query_string_is_ignored(server: MetricsServer):
    status, _, body = scrape(server.url + "?name[]=x")
    assert status == 200 and b"admission_requests_total 3.0" in body


@pytest.mark.parametrize("path", ["/", "/metrics/", "/favicon.ico", "/metricsx"])
def test_other_paths_are_not_found(server: MetricsServer, path: str):
    status, _, _ = scrape(server.url.removesuffix("/metrics") + path)
    assert status == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS"])
def test_other_methods_are_not_allowed(server: MetricsServer, method: str):
    status, headers, _ = scrape(server.url, method)
    assert status == 405 and headers["Allow"] == "GET, HEAD"


@pytest.mark.parametrize("garbage", [b"\x00\xff\xfe garbage\r\n\r\n", b"GET\r\n\r\n",
                                     b"GET /metrics\r\n\r\n", b"GET metrics HTTP/1.1\r\n\r\n",
                                     b"GET /m\xe9trics HTTP/1.1\r\n\r\n"])
def test_a_garbage_request_is_a_bad_request(server: MetricsServer, garbage: bytes):
    assert raw(server, garbage).startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert scrape(server.url)[0] == 200


def test_bare_newlines_end_the_head_too(server: MetricsServer):
    answer = raw(server, b"GET /metrics HTTP/1.0\n\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"admission_requests_total 3.0" in answer


@pytest.mark.parametrize("end", [b"", b"\r\n\r\n"])  # never ending, or ending too late
def test_a_head_too_large_is_refused(server: MetricsServer, end: bytes):
    head = b"GET /metrics HTTP/1.1\r\nX-Filler: " + b"a" * metrics_http.MAX_HEAD_BYTES
    answer = raw(server, head + end)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert scrape(server.url)[0] == 200


def test_a_slow_or_silent_client_does_not_block_the_next_scrape(server: MetricsServer):
    port = port_of(server)
    silent = socket.create_connection(("127.0.0.1", port))
    slow = socket.create_connection(("127.0.0.1", port))
    try:
        slow.sendall(b"GET /metr")  # and nothing more
        began = time.monotonic()
        status, _, body = scrape(server.url)
        assert status == 200 and b"admission_requests_total 3.0" in body
        assert time.monotonic() - began < SCRAPE_TIMEOUT_S
    finally:
        silent.close()
        slow.close()


def test_a_slow_client_is_dropped_at_its_deadline(monkeypatch, metrics: PluginMetrics):
    monkeypatch.setattr(metrics_http, "HEAD_DEADLINE_S", 0.3)
    server = MetricsServer(metrics, MetricsAddress("127.0.0.1", 0))
    try:
        with socket.create_connection(("127.0.0.1", port_of(server)), timeout=5) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
            began = time.monotonic()
            assert sock.recv(100) == b""  # closed unanswered, well before our own timeout
            assert time.monotonic() - began < 3
    finally:
        server.stop()


def test_clients_over_the_connection_cap_are_closed_and_the_server_recovers(
        monkeypatch, metrics: PluginMetrics):
    monkeypatch.setattr(metrics_http, "MAX_CONNECTIONS", 2)
    server = MetricsServer(metrics, MetricsAddress("127.0.0.1", 0))
    port = port_of(server)
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
    try:
        time.sleep(0.2)  # the server has accepted both: the only way to know is to wait
        with socket.create_connection(("127.0.0.1", port), timeout=5) as third:
            third.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            assert third.recv(100) == b""  # no slot: closed unanswered
    finally:
        for sock in held:
            sock.close()
    try:
        # The held connections' threads end on close.
        until(lambda: scrape_status(server) == 200, 5, 0.05)
    finally:
        server.stop()


def scrape_status(server: MetricsServer) -> int | None:
    try:
        return scrape(server.url)[0]
    except OSError:
        return None


def test_a_failing_render_is_a_500_and_the_server_stays_up(server: MetricsServer,
                                                          monkeypatch, caplog):
    real = server._server.render
    monkeypatch.setattr(server._server, "render", lambda: 1 / 0)
    assert scrape(server.url)[0] == 500
    assert "metrics: cannot render a scrape" in caplog.text
    monkeypatch.setattr(server._server, "render", real)
    assert scrape(server.url)[0] == 200


def test_many_scrapes_at_once(server: MetricsServer):
    results: list[int] = []

    def one() -> None:
        results.append(scrape(server.url)[0])

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 8


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
def test_an_ipv6_address(metrics: PluginMetrics):
    server = MetricsServer(metrics, MetricsAddress("::1", 0))
    try:
        assert server.url.startswith("http://[::1]:")
        assert scrape(server.url)[0] == 200
    finally:
        server.stop()


def test_a_host_name(metrics: PluginMetrics):
    server = MetricsServer(metrics, MetricsAddress("localhost", 0))
    try:
        assert scrape(server.url)[0] == 200
    finally:
        server.stop()


def test_a_name_that_does_not_resolve_is_one_line(metrics: PluginMetrics):
    with pytest.raises(MetricsError) as e:
        MetricsServer(metrics, MetricsAddress("no-such-host.invalid", 0))
    assert str(e.value).startswith("metrics address no-such-host.invalid:0: cannot listen: ")
    assert "\n" not in str(e.value)


def test_a_name_that_cannot_be_asked_for_is_one_line(metrics: PluginMetrics):
    with pytest.raises(MetricsError, match="metrics address a{70}.example:0: .*too long"):
        MetricsServer(metrics, MetricsAddress("a" * 70 + ".example", 0))
