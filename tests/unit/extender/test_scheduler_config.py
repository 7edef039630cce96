"""The packaged KubeSchedulerConfiguration asks for what the extender serves, and the lab's
configuration (tests/e2e_k8s/extender_lab.py, the docs' worked example) is that one pointed at
127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import yaml

from nri_numa.cli.main import build_parser
from tests.certificates import KeyPair
from tests.e2e_k8s.extender_lab import PACKAGED_CONFIG, scheduler_config

EXTENDER_MANIFESTS = PACKAGED_CONFIG.parent / "scheduler-extender.yaml"


def test_the_packaged_extender_entry_names_the_verbs_the_extender_serves():
    config = yaml.safe_load(PACKAGED_CONFIG.read_text())
    assert (config["apiVersion"], config["kind"]) == ("kubescheduler.config.k8s.io/v1beta1",
                                                      "KubeSchedulerConfiguration")
    [extender] = config["extenders"]
    # the verbs nri_numa/extender/server.py answers under the CLI's default prefix
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter", "prioritize", "bind")
    args = build_parser().parse_args(["scheduler-extender"])
    url = urlsplit(extender["urlPrefix"])
    assert url.path == args.prefix
    # HTTPS on the Deployment's port, with a client certificate and the CA of the extender's
    assert url.scheme == "https" and extender["enableHTTPS"] is True
    assert url.port == deployed_port()
    assert set(extender["tlsConfig"]) == {"certFile", "keyFile", "caFile"}
    # node names only: the extender reads every node from its own cache
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False  # a pod it could not judge is not sent anyway
    assert "managedResources" not in extender  # every pod, not only those asking for devices


def deployed_port() -> int:
    """The port the packaged Deployment's extender listens on, as its Service exposes it."""
    documents = list(yaml.safe_load_all(EXTENDER_MANIFESTS.read_text()))
    [deployment] = [d for d in documents if d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    port = int(args.listen.rsplit(":", 1)[1])
    [service] = [d for d in documents if d["kind"] == "Service"]
    [exposed] = service["spec"]["ports"]
    assert exposed["port"] == port and container["ports"][0]["containerPort"] == port
    assert args.tls_cert and args.tls_key and args.client_ca  # never plain HTTP off loopback
    return port


def test_the_labs_configuration_is_the_packaged_one_on_127_0_0_1():
    packaged = yaml.safe_load(PACKAGED_CONFIG.read_text())["extenders"][0]
    client = KeyPair(Path("/lab/tls/kube-scheduler.crt"), Path("/lab/tls/kube-scheduler.key"))
    lab = scheduler_config(Path("/lab/kubeconfig"), 4321, 4322, client,
                           Path("/lab/tls/server-ca.crt"))
    [extender] = lab["extenders"]
    assert extender["urlPrefix"] == "https://127.0.0.1:4321/nri-numa"
    assert extender["tlsConfig"] == {"certFile": "/lab/tls/kube-scheduler.crt",
                                     "keyFile": "/lab/tls/kube-scheduler.key",
                                     "caFile": "/lab/tls/server-ca.crt"}
    changed = {"urlPrefix", "tlsConfig"}
    assert {k: v for k, v in extender.items() if k not in changed} == {
        k: v for k, v in packaged.items() if k not in changed}
    assert lab["clientConnection"]["kubeconfig"] == "/lab/kubeconfig"
    assert lab["healthzBindAddress"] == lab["metricsBindAddress"] == "127.0.0.1:4322"
