"""The packaged KubeSchedulerConfiguration asks for what the extender serves, and the lab's
configuration (tests/e2e_k8s/extender_lab.py, the docs' worked example) is that one pointed at
127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import yaml

from nri_numa.cli.main import build_parser
from tests.e2e_k8s.extender_lab import PACKAGED_CONFIG, scheduler_config


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
    assert url.port == int(args.listen.rsplit(":", 1)[1])
    # node names only: the extender reads every node from its own cache
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False  # a pod it could not judge is not sent anyway
    assert "managedResources" not in extender  # every pod, not only those asking for devices


def test_the_labs_configuration_is_the_packaged_one_on_127_0_0_1():
    packaged = yaml.safe_load(PACKAGED_CONFIG.read_text())["extenders"][0]
    lab = scheduler_config(Path("/lab/kubeconfig"), 4321, 4322)
    [extender] = lab["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:4321/nri-numa"
    assert {k: v for k, v in extender.items() if k != "urlPrefix"} == {
        k: v for k, v in packaged.items() if k != "urlPrefix"}
    assert lab["clientConnection"]["kubeconfig"] == "/lab/kubeconfig"
    assert lab["healthzBindAddress"] == lab["metricsBindAddress"] == "127.0.0.1:4322"
