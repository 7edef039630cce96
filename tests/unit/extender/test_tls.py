"""The extender over HTTPS: only clients with a certificate the client CA signed are served
(real TLS on 127.0.0.1, certificates made with openssl)."""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
import time

import pytest

from nri_numa.cli.main import main
from nri_numa.extender.cache import NodeCache
from nri_numa.extender.server import ExtenderServer, TlsError, tls_context
from nri_numa.extender.verbs import Extender
from tests.certificates import make_ca, make_signed


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    server_ca, client_ca, rogue_ca = (make_ca(folder, n) for n in ("server-ca", "client-ca",
                                                                   "rogue-ca"))
    return {"server_ca": server_ca, "client_ca": client_ca,
            "server": make_signed(folder, "extender", server_ca, server=True),
            "scheduler": make_signed(folder, "kube-scheduler", client_ca, server=False),
            "rogue": make_signed(folder, "rogue", rogue_ca, server=False)}


@pytest.fixture
def server(pki):
    context = tls_context(str(pki["server"].cert), str(pki["server"].key),
                          str(pki["client_ca"].cert))
    server = ExtenderServer(("127.0.0.1", 0), Extender(NodeCache()), prefix="/x", tls=context)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def client(pki, port: int, pair=None) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=str(pki["server_ca"].cert))
    if pair is not None:
        context.load_cert_chain(str(pair.cert), str(pair.key))
    return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)


def filter_request(conn: http.client.HTTPSConnection) -> dict:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
           "spec": {"containers": [{"name": "main"}]}}
    conn.request("POST", "/x/filter", json.dumps({"Pod": pod, "NodeNames": ["n"]}).encode())
    answer = conn.getresponse()
    assert answer.status == 200
    return json.loads(answer.read())


def test_the_schedulers_certificate_is_served(pki, server):
    conn = client(pki, server, pki["scheduler"])
    assert filter_request(conn)["NodeNames"] == ["n"]
    assert filter_request(conn)["NodeNames"] == ["n"]  # the connection is kept


@pytest.mark.parametrize("who", ["none", "rogue", "plain"])
def test_a_client_without_a_certificate_the_client_ca_signed_is_refused(pki, server, who, caplog):
    caplog.set_level(logging.WARNING, logger="nri_numa.extender.server")
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        if who == "plain":
            conn = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
        else:
            conn = client(pki, server, pki["rogue"] if who == "rogue" else None)
        filter_request(conn)
    deadline = time.monotonic() + 10  # the server's thread logs after the client has failed
    while not caplog.records and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("refused a connection from 127.0.0.1")
    # The server goes on serving the scheduler.
    assert filter_request(client(pki, server, pki["scheduler"]))["NodeNames"] == ["n"]


def test_a_tcp_probe_is_not_logged_as_a_refusal(pki, server, caplog):
    import socket

    caplog.set_level(logging.WARNING, logger="nri_numa.extender.server")
    socket.create_connection(("127.0.0.1", server), timeout=5).close()
    assert filter_request(client(pki, server, pki["scheduler"]))["NodeNames"] == ["n"]
    time.sleep(0.2)
    assert caplog.records == []


def test_unreadable_certificate_files_are_one_line(pki, tmp_path):
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(TlsError, match=r"^--tls-cert .*junk.pem") as e:
        tls_context(str(tmp_path / "junk.pem"), str(pki["server"].key), str(pki["client_ca"].cert))
    assert "\n" not in str(e.value)
    with pytest.raises(TlsError, match=r"^--client-ca .*missing.pem"):
        tls_context(str(pki["server"].cert), str(pki["server"].key), str(tmp_path / "missing.pem"))


@pytest.mark.parametrize(("argv", "expected"), [
    (["--listen", "0.0.0.0:8888"], "plain HTTP is served on a loopback address only"),
    (["--listen", "[::]:8888"], "plain HTTP is served on a loopback address only"),
    (["--listen", "0.0.0.0:8888", "--tls-cert", "c.pem"], "go together"),
])
def test_the_command_refuses_plain_http_beyond_loopback(argv, expected, capsys):
    assert main(["scheduler-extender", *argv]) != 0
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1
