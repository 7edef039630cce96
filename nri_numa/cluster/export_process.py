"""The export process: started by ``nri-numa run`` (nri_numa.cluster.feed), it keeps the node's
NodeResourceTopology object in the API server equal to the latest one the agent sent, and acts
on the refusals the agent reports. All Kubernetes API traffic of the agent happens here, so a
slow, down or refusing API server never touches a CreateContainer, and the ``kubernetes`` client
(tens of MB, a second to import) never loads into the agent.

Runs until its standard input closes (the agent stopped or died). Writes: when a new object
arrives (the agent already batches changes), after a failure with growing waits (0.5 s doubling
to 4 s) until the server takes it, and every resync period, when it reads the object back and
mends what others changed.

With ``--node``, it also watches that node's pods and tells the agent their specs
(nri_numa.cluster.pod_watch), for the whole pod at its first container.

    python -m nri_numa.cluster.export_process [--kubeconfig FILE] --resync SECONDS
        --evict true|false --evict-after N --eviction-delay SECONDS [--node NAME]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from nri_numa.cluster import channel
from nri_numa.cluster.channel import ExportStatus
from nri_numa.cluster.nrt_writer import ApiError, KubernetesNrtApi, NrtApi, NrtWriter

BACKOFF_FIRST = 0.5
BACKOFF_CAP = 4.0  # seconds: the object is right again within about 5 s of the server's return
NODE_LOOKUP_S = 5.0

MessageHandler = Callable[[dict[str, Any]], None]


class Inbox:
    """What the agent sent, kept by the reader thread: only the latest object matters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.arrived = threading.Event()
        self.closed = False
        self._latest: dict[str, Any] | None = None
        self._fresh = False
        self._others: list[dict[str, Any]] = []

    def put(self, message: dict[str, Any]) -> None:
        with self._lock:
            if message["kind"] == "nrt" and isinstance(message.get("object"), dict):
                self._latest, self._fresh = message["object"], True
            else:
                self._others.append(message)
        self.arrived.set()

    def close(self) -> None:
        self.closed = True
        self.arrived.set()

    def take(self) -> tuple[dict[str, Any] | None, bool, list[dict[str, Any]]]:
        """(the latest object, whether it is new since the last take, other messages)."""
        with self._lock:
            fresh, self._fresh = self._fresh, False
            others, self._others = self._others, []
            self.arrived.clear()
            return self._latest, fresh, others


class Exporter:
    def __init__(self, api: NrtApi, say: Callable[[dict[str, Any]], None], resync_s: float,
                 handlers: dict[str, MessageHandler] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._writer = NrtWriter(api)
        self._say = say
        self._resync_s = resync_s
        self._handlers = handlers or {}
        self._clock = clock
        self.status = ExportStatus()
        self._delay = BACKOFF_FIRST
        self._retry_at: float | None = None
        self._check_at = clock() + resync_s
        self._unknown_kinds: set[str] = set()

    def serve(self, inbox: Inbox) -> None:
        while True:
            inbox.arrived.wait(timeout=self._wait_s())
            if inbox.closed:
                return
            desired, fresh, others = inbox.take()
            for message in others:
                self._handle(message)
            now = self._clock()
            check = now >= self._check_at
            due = fresh or check or (self._retry_at is not None and now >= self._retry_at)
            if desired is not None and due:
                self.write(desired, read_first=check)

    def write(self, desired: dict[str, Any], *, read_first: bool) -> None:
        try:
            result = self._writer.ensure(desired, read_first=read_first)
        except ApiError as e:
            self._failed(str(e))
            return
        except Exception as e:  # an unexpected answer must not end the export
            self._failed(f"{type(e).__name__}: {str(e)[:300]}")
            return
        now = self._clock()
        # Until the Node exists (the agent may start before the kubelet registers it) the
        # object has no owner: look again soon.
        self._check_at = now + (self._resync_s if self._writer.owned_by_node
                                else min(self._resync_s, NODE_LOOKUP_S))
        self._retry_at, self._delay = None, BACKOFF_FIRST
        recovered = self.status.state != "synced"
        if recovered:
            self._log("info", f"NodeResourceTopology {desired['metadata']['name']} {result.action}"
                      + (" (the API server answers again)" if self.status.state == "failing" else ""))
        elif result.mended:
            self._log("info", f"NodeResourceTopology {desired['metadata']['name']} mended: it had "
                      "been changed by someone else")
        self.status = ExportStatus("synced", result.action, self.status.writes
                                   + (result.action != "unchanged"), self.status.errors,
                                   time.time())
        self._say(self.status.to_message())

    def _failed(self, why: str) -> None:
        self._writer.forget()
        if self.status.state != "failing":  # one line when it starts failing, not per retry
            self._log("warning", f"NodeResourceTopology not written: {why}; retrying with "
                      f"waits from {BACKOFF_FIRST} s to {BACKOFF_CAP:.0f} s")
        self._retry_at = self._clock() + self._delay
        self._delay = min(BACKOFF_CAP, self._delay * 2)
        self.status = ExportStatus("failing", why[:500], self.status.writes,
                                   self.status.errors + 1, self.status.last_success)
        self._say(self.status.to_message())

    def _handle(self, message: dict[str, Any]) -> None:
        handler = self._handlers.get(message["kind"])
        if handler is not None:
            try:
                handler(message)
            except Exception as e:
                self._log("warning", f"{message['kind']} message not handled: "
                          f"{type(e).__name__}: {str(e)[:300]}")
        elif message["kind"] not in self._unknown_kinds:
            self._unknown_kinds.add(message["kind"])
            self._log("warning", f"messages of kind {message['kind'][:40]!r} are not understood "
                      "by this export process: ignored")

    def _wait_s(self) -> float:
        until = min(t for t in (self._retry_at, self._check_at) if t is not None)
        return max(0.05, until - self._clock())

    def _log(self, level: str, text: str) -> None:
        self._say({"kind": "log", "level": level, "message": text})


def read_messages(stream: BinaryIO, inbox: Inbox, say: Callable[[dict[str, Any]], None]) -> None:
    """The reader thread: every line into the inbox until the stream closes."""
    warned = False
    try:
        while line := stream.readline(channel.MAX_LINE + 1):
            try:
                inbox.put(channel.decode(line))
            except channel.BadLine as e:
                if not warned:
                    say({"kind": "log", "level": "warning", "message": f"export process: {e}"})
                    warned = True
    finally:
        inbox.close()


def api_client(kubeconfig: str | None) -> Any:
    """A client from the kubeconfig file, else the pod's service account. Its HTTP layer does
    not retry on its own: a call fails fast and the exporter's waits decide when to try again
    (urllib3's three silent retries made one failed call last up to four read timeouts)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    configuration.retries = False
    if not configuration.verify_ssl:
        # The kubeconfig asks for it (insecure-skip-tls-verify): said once by main, not once
        # per request on the agent's standard error.
        import urllib3

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    return client.ApiClient(configuration)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nri-numa export process")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--resync", type=float, default=60.0)
    parser.add_argument("--evict", choices=("true", "false"), default="true")
    parser.add_argument("--evict-after", type=int, default=3)
    parser.add_argument("--eviction-delay", type=float, default=30.0)
    parser.add_argument("--node", default="")
    args = parser.parse_args(argv)
    out_lock = threading.Lock()

    def say(message: dict[str, Any]) -> None:
        with out_lock:
            try:
                sys.stdout.buffer.write(channel.encode(message))
                sys.stdout.buffer.flush()
            except (BrokenPipeError, ValueError):
                pass  # the agent is gone; stdin closes next

    try:
        client = api_client(args.kubeconfig)
    except Exception as e:  # a bad kubeconfig: said once, the agent restarts us later
        say(ExportStatus("failing", f"cannot make a Kubernetes client: {str(e)[:300]}",
                         errors=1).to_message())
        return 2
    if not client.configuration.verify_ssl:
        say({"kind": "log", "level": "warning", "message": "the kubeconfig turns TLS "
             "verification off (insecure-skip-tls-verify): the API server is not authenticated"})
    inbox = Inbox()
    threading.Thread(target=read_messages, args=(sys.stdin.buffer, inbox, say),
                     name="agent-messages", daemon=True).start()
    from nri_numa.cluster.refusals import EvictionPolicy, message_handlers

    policy = EvictionPolicy(args.evict == "true", args.evict_after, args.eviction_delay)
    exporter = Exporter(KubernetesNrtApi(client), say, args.resync,
                        handlers=message_handlers(client, say, policy))
    say(exporter.status.to_message())
    if args.node:
        from nri_numa.cluster import pod_watch

        pod_watch.started(client, args.node, say)
    exporter.serve(inbox)
    return 0


if __name__ == "__main__":
    sys.exit(main())
