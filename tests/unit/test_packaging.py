"""packaging/: the Kubernetes manifests have what the API server requires and agree with each
other, their nri-numa arguments and configuration are ones nri-numa accepts, the runtime
snippets parse with the tables and keys the runtimes read, and the Containerfile starts from the
local base and installs without a package index. (`containerd config dump` of the real binaries:
tests/e2e/test_packaging_containerd.py; the image built and run: tests/e2e/test_image.py.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from nri_numa.agent.inputs import config_from_text
from nri_numa.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
PACKAGING = REPO / "packaging"
MANIFEST = PACKAGING / "kubernetes" / "nri-numa.yaml"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# CRI-O's [crio.nri] keys (internal/config/nri, CRI-O 1.26+).
CRIO_NRI_KEYS = {"enable_nri", "nri_listen", "nri_plugin_dir", "nri_plugin_config_dir",
                 "nri_plugin_registration_timeout", "nri_plugin_request_timeout",
                 "nri_disable_connections"}


def documents() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d is not None]
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs), "one object of each kind"
    return by_kind


def pod_spec() -> dict:
    return documents()["DaemonSet"]["spec"]["template"]["spec"]


def the_container() -> dict:
    [container] = pod_spec()["containers"]
    return container


def test_every_object_has_what_the_api_server_requires():
    expected = {"ServiceAccount": "v1", "ConfigMap": "v1", "DaemonSet": "apps/v1",
                "ClusterRole": "rbac.authorization.k8s.io/v1",
                "ClusterRoleBinding": "rbac.authorization.k8s.io/v1"}
    docs = documents()
    assert {k: d["apiVersion"] for k, d in docs.items()} == expected
    for doc in docs.values():
        meta = doc["metadata"]
        cluster_wide = doc["kind"].startswith("Cluster")
        assert DNS_LABEL.fullmatch(meta["name"])
        assert ("namespace" not in meta) if cluster_wide else meta["namespace"] == "kube-system"


def test_the_daemonset_selects_its_own_pods():
    spec = documents()["DaemonSet"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert spec["updateStrategy"]["type"] in ("RollingUpdate", "OnDelete")


def test_the_pod_is_node_critical_and_its_account_may_do_what_the_export_does_and_no_more():
    spec, docs = pod_spec(), documents()
    assert spec["priorityClassName"] == "system-node-critical"
    account = docs["ServiceAccount"]["metadata"]
    assert spec["serviceAccountName"] == account["name"]
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"],
                                    "namespace": account["namespace"]}]
    granted = {(group, resource, verb) for rule in docs["ClusterRole"]["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    # The export process's calls (nri_numa/cluster): only pods are listed and watched (the
    # node's own, nri_numa/cluster/pod_watch.py); nothing is deleted.
    assert ("topology.node.k8s.io", "noderesourcetopologies", "update") in granted
    assert ("", "nodes", "get") in granted and ("", "pods/eviction", "create") in granted
    assert {("", "pods", "list"), ("", "pods", "watch")} <= granted
    assert {(g, r) for g, r, verb in granted if verb in ("list", "watch")} == {("", "pods")}
    assert not {verb for _, _, verb in granted} & {"delete", "*"}
    [node_name] = [e for e in the_container()["env"] if e["name"] == "NODE_NAME"]
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_every_mount_names_a_volume_and_the_host_paths_are_the_ones_nri_numa_uses():
    spec, container = pod_spec(), the_container()
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert set(mounts) == set(volumes)
    host = {v["hostPath"]["path"]: mounts[name] for name, v in volumes.items() if "hostPath" in v}
    assert set(host) == {"/var/run/nri", "/sys", "/var/lib/nri-numa",
                         "/var/lib/kubelet/pod-resources", "/dev", "/etc/cdi", "/var/run/cdi"}
    for path, mount in host.items():
        if path != "/dev":  # the container has a /dev of its own; --dev-root names this one
            assert mount["mountPath"] == path  # nri-numa finds them where the host has them
    for read_only in ("/sys", "/dev", "/etc/cdi", "/var/run/cdi"):
        assert host[read_only].get("readOnly") is True
    assert host["/var/lib/nri-numa"].get("readOnly") is not True  # the checkpoint is written
    assert host["/var/run/nri"].get("readOnly") is not True


def test_the_container_runs_nri_numa_run_with_options_it_accepts():
    container = the_container()
    assert container["name"] and container["image"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "run"
    config_dir = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["config"]
    assert Path(args.config).parent == Path(config_dir)
    assert args.state_dir == "/var/lib/nri-numa" and args.nri_socket == "/var/run/nri/nri.sock"
    dev_mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["dev"]
    assert args.dev_root == dev_mount
    key = Path(args.config).name
    assert key in documents()["ConfigMap"]["data"]


def test_the_configmaps_config_is_one_nri_numa_accepts():
    text = documents()["ConfigMap"]["data"]["config.yaml"]
    config = config_from_text(text, "ConfigMap nri-numa-config")
    assert config.cpu_manager_policy == "static"
    assert config.topology_manager_policy == "single-numa-node"
    assert "nriNuma:" in text  # where nri-numa's own settings go


def test_the_container_is_burstable_and_unprivileged():
    container = the_container()
    resources = container["resources"]
    # Burstable: requests below limits (no CPU limit), so it never gets exclusive CPUs.
    assert "cpu" in resources["requests"] and "cpu" not in resources.get("limits", {})
    security = container["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("name, version", [("containerd-1.7-nri.toml", 2),
                                           ("containerd-2.x-nri.toml", 3)])
def test_containerd_snippets_parse_with_the_nri_plugin_table(name, version):
    config = tomllib.loads((PACKAGING / name).read_text())
    assert config["version"] == version
    nri = config["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["disable"] is False and nri["disable_connections"] is False
    assert nri["socket_path"] == "/var/run/nri/nri.sock"


def test_the_crio_drop_in_turns_nri_on_with_crios_key_names():
    config = tomllib.loads((PACKAGING / "crio-nri.conf").read_text())
    nri = config["crio"]["nri"]
    assert set(nri) <= CRIO_NRI_KEYS, set(nri) - CRIO_NRI_KEYS
    assert nri["enable_nri"] is True and nri["nri_listen"] == "/var/run/nri/nri.sock"
    assert nri["nri_disable_connections"] is False


def test_the_containerfile_starts_from_the_local_base_and_installs_without_an_index():
    """Built for real by tests/e2e/test_image.py (scripts/image); here, what keeps it off
    registries: its base is the local mmdebstrap one, and pip never asks an index."""
    text = (PACKAGING / "Containerfile").read_text()
    assert re.findall(r"^FROM (.+)$", text, re.M) == ["${BASE}"]
    assert re.findall(r"^ARG BASE=(.+)$", text, re.M) == ["localhost/nri-numa-base:latest"]
    assert "--no-index" in text and "--find-links /wheels" in text
    assert not re.search(r"^(COPY|ADD) ", text, re.M)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "nri-numa" in project["scripts"] and "cluster" in project["optional-dependencies"]
    assert 'ENTRYPOINT ["nri-numa"]' in text


def test_the_packaging_readme_lists_every_file():
    readme = (PACKAGING / "README.md").read_text()
    shipped = [p.relative_to(PACKAGING).as_posix() for p in PACKAGING.rglob("*")
               if p.is_file() and p.name != "README.md"]
    for name in shipped:
        assert f"`{name}`" in readme, name


def test_the_kustomization_installs_the_crd_and_the_daemonset_of_the_built_image():
    """`kubectl apply -k packaging/kubernetes` (applied for real: tests/e2e_k8s_install): the CRD
    and the agent's manifest, not the extender's (it needs its Secret first) nor the
    KubeSchedulerConfiguration (a file for kube-scheduler, no API object); the manifests name
    the image scripts/image builds."""
    import nri_numa

    folder = PACKAGING / "kubernetes"
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["noderesourcetopology-crd.yaml", "nri-numa.yaml"]
    image = f"localhost/nri-numa:{nri_numa.__version__}"
    assert the_container()["image"] == image
    extender = [d for d in yaml.safe_load_all((folder / "scheduler-extender.yaml").read_text())
                if d["kind"] == "Deployment"]
    assert [c["image"] for c in extender[0]["spec"]["template"]["spec"]["containers"]] == [image]
