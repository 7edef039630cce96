"""``nri-numa scheduler-extender``: the kube-scheduler extender that runs each node's own engine
on the state the node publishes (docs/scheduler-extender.md)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from nri_numa.cli.errors import CliError

if TYPE_CHECKING:
    import ssl


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scheduler-extender",
        help="serve kube-scheduler's extender verbs (filter, prioritize, bind) with each "
             "node's own engine",
        description="A kube-scheduler extender (the v1.20 wire API): filter keeps the "
                    "nodes whose published nri-numa state admits the pod, with each dropped "
                    "node's reason; prioritize prefers fewer NUMA nodes, then least or most "
                    "allocated; bind holds the pod as assumed on its node, records the chosen "
                    "NUMA nodes on it (numa.nri.io/scheduled-numa-nodes) and binds it, only for "
                    "a pod it filtered that is still Pending for --scheduler-name. It serves "
                    "HTTPS with client certificates (--tls-cert, --tls-key, --client-ca), or "
                    "plain HTTP on a loopback address only. When a node's publication frees "
                    "room, the pods it refused there are retried at once.")
    p.add_argument("--listen", default="127.0.0.1:8888", metavar="HOST:PORT",
                   help="address to serve on (default 127.0.0.1:8888); other than loopback "
                        "only with TLS")
    p.add_argument("--tls-cert", metavar="FILE", help="the server's certificate (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="the server's private key (PEM)")
    p.add_argument("--client-ca", metavar="FILE",
                   help="CA certificates (PEM): only clients with a certificate they signed "
                        "are served (kube-scheduler's extender tlsConfig certFile/keyFile)")
    p.add_argument("--scheduler-name", default="default-scheduler",
                   help="bind only pods whose spec.schedulerName is this (default "
                        "default-scheduler)")
    p.add_argument("--prefix", default="/nri-numa",
                   help="URL prefix of the verbs, the urlPrefix's path (default /nri-numa)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: the pod's service account)")
    p.add_argument("--packing", choices=("LeastAllocated", "MostAllocated"),
                   default="LeastAllocated",
                   help="among equally aligned nodes, prefer the emptiest (default) or fullest")
    p.add_argument("--assume-seconds", type=float, default=30.0,
                   help="how long a bound pod counts on its node before the node's publication "
                        "shows it (default 30)")
    p.set_defaults(func=cmd_scheduler_extender)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise CliError(f"--listen: {text[:60]!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    from nri_numa.extender.server import TlsError, tls_context

    given = [args.tls_cert, args.tls_key, args.client_ca]
    if not any(given):
        if not _is_loopback(_address(args.listen)[0]):
            raise CliError(f"--listen {args.listen}: plain HTTP is served on a loopback address "
                           "only (a sidecar of kube-scheduler); elsewhere give --tls-cert, "
                           "--tls-key and --client-ca")
        return None
    if not all(given):
        raise CliError("--tls-cert, --tls-key and --client-ca go together: clients are served "
                       "only with a certificate the client CA signed")
    try:
        return tls_context(args.tls_cert, args.tls_key, args.client_ca)
    except TlsError as e:
        raise CliError(str(e)) from None


def cmd_scheduler_extender(args: argparse.Namespace) -> int:
    import logging
    import threading

    from nri_numa.extender.cache import NodeCache
    from nri_numa.extender.server import ExtenderServer
    from nri_numa.extender.verbs import Extender, Packing

    if not 0 < args.assume_seconds <= 3600:
        raise CliError("--assume-seconds: must be more than 0 and at most 3600")
    address = _address(args.listen)
    tls = _tls(args)
    try:
        from nri_numa.cluster.export_process import api_client
        from nri_numa.extender.watch import ApiPods, Retrier, started, wait_synced
    except ImportError as e:
        raise CliError(f"the kubernetes client is not installed (the cluster extra): {e}") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        client = api_client(args.kubeconfig)
    except Exception as e:  # the client's config errors have no common type
        raise CliError(f"--kubeconfig: {' '.join(str(e).split())[:200]}") from None
    pods = ApiPods(client)
    cache = NodeCache(assume_seconds=args.assume_seconds)
    extender = Extender(cache, pods, Packing(args.packing), scheduler_name=args.scheduler_name)
    retrier = Retrier(pods, extender)
    cache.on_room = retrier.room_freed
    stop = started(client, cache)
    wait_synced(cache, 5.0)
    try:
        server = ExtenderServer(address, extender, prefix=args.prefix, tls=tls)
    except OSError as e:
        raise CliError(f"--listen {args.listen}: {e.strerror or e}") from None
    threading.Thread(target=retrier.run, args=(stop,), name="retries", daemon=True).start()
    logging.getLogger(__name__).info("serving %s on %s:%d%s for %d nodes",
                                     "HTTPS (client certificates)" if tls else "plain HTTP",
                                     *server.server_address[:2], args.prefix, len(cache.nodes()))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.server_close()
    return 0
