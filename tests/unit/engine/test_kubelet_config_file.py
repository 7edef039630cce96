"""A kubelet's own config file handed to nri-numa as it is (issue 14 item 4): the keys nri-numa
reads are read, the kubelet's other keys are named once and left alone, typos are refused with
the nearest name, and every problem of a file is reported together."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nri_numa.agent.inputs import InputFileError, config_from_text, read_config_document
from nri_numa.engine.config import ConfigError, CpuManagerPolicy, TopologyPolicy
from nri_numa.engine.config_reader import read_kubelet_configuration
from nri_numa.engine.kubelet_keys import IGNORED_KUBELET_KEYS
from nri_numa.nri.daemon import load_config

# As kubeadm writes /var/lib/kubelet/config.yaml, with the managers turned on.
KUBEADM_CONFIG = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: ""
cpuManagerReconcilePeriod: 0s
evictionHard:
  memory.available: 100Mi
  nodefs.available: 10%
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMaximumGCAge: 0s
imageMinimumGCAge: 0s
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
cpuManagerPolicy: static
reservedSystemCPUs: "0"
topologyManagerPolicy: single-numa-node
featureGates:
  CPUManagerPolicyOptions: true
"""


def test_a_kubeadm_config_is_read_as_it_is():
    config, ignored = read_kubelet_configuration(_yaml(KUBEADM_CONFIG))
    assert config.cpu_manager_policy is CpuManagerPolicy.STATIC
    assert config.topology_manager_policy is TopologyPolicy.SINGLE_NUMA_NODE
    assert config.reserved_system_cpus == {0}
    assert config.cpu_manager_reconcile_period == 0.0
    assert "evictionHard" in ignored and "authentication" in ignored
    assert "cpuManagerPolicy" not in ignored
    assert list(ignored) == sorted(ignored)


def test_the_labs_kubelet_config_is_read_as_it_is():
    # The config tests/e2e_k8s/lab.py gives its real kubelet (JSON, as the lab writes it).
    text = ('{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", '
            '"address": "127.0.0.1", "port": 10250, "readOnlyPort": 0, "healthzPort": 0, '
            '"authentication": {"anonymous": {"enabled": true}, "webhook": {"enabled": false}}, '
            '"authorization": {"mode": "AlwaysAllow"}, "cgroupDriver": "cgroupfs", '
            '"cgroupRoot": "/nri-numa-lab", "cpuManagerPolicy": "none", '
            '"topologyManagerPolicy": "none", "failSwapOn": false, '
            '"enforceNodeAllocatable": [], "evictionHard": {"memory.available": "1Mi"}, '
            '"imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99, '
            '"makeIPTablesUtilChains": false, "nodeStatusUpdateFrequency": "4s"}')
    config = config_from_text(text, "kubelet.yaml")
    assert config.cpu_manager_policy is CpuManagerPolicy.NONE


KUBELET_1_36 = Path(__file__).parents[2] / "fixtures/kubelet-1.36/kubelet-config.yaml"
# The resource managers' keys of KubeletConfiguration (1.36), all read by nri-numa.
RESOURCE_MANAGER_KEYS = {"cpuManagerPolicy", "cpuManagerPolicyOptions",
                         "cpuManagerReconcilePeriod", "memoryManagerPolicy", "reservedMemory", "topologyManagerPolicy",
                         "topologyManagerScope", "topologyManagerPolicyOptions",
                         "reservedSystemCPUs", "kubeReserved", "systemReserved"}


def test_a_whole_136_kubelet_config_loads_with_every_resource_manager_key_read():
    text = KUBELET_1_36.read_text()
    document = read_config_document(KUBELET_1_36)  # as `nri-numa run --config` reads it
    config = document.engine
    assert config.cpu_manager_policy is CpuManagerPolicy.STATIC
    assert config.cpu_options.full_pcpus_only and config.cpu_options.strict_cpu_reservation
    assert config.cpu_options.prefer_align_cpus_by_uncorecache
    assert config.topology_manager_policy is TopologyPolicy.SINGLE_NUMA_NODE
    assert str(config.topology_manager_scope) == "pod"
    assert config.max_allowable_numa_nodes == 8 and config.prefer_closest_numa_nodes
    assert str(config.memory_manager_policy) == "Static"
    assert config.reserved_memory_by_node == {0: {"memory": 1074 << 20},
                                              1: {"memory": 1074 << 20}}
    assert config.reserved_system_cpus == {0, 4} and config.cpu_manager_reconcile_period == 10
    keys = set(_yaml(text)) - {"apiVersion", "kind"}
    assert len(keys) == 125  # every field of the 1.36 type
    assert RESOURCE_MANAGER_KEYS <= keys
    assert not RESOURCE_MANAGER_KEYS & set(document.ignored_kubelet_keys)
    assert set(document.ignored_kubelet_keys) == keys - RESOURCE_MANAGER_KEYS


def test_every_known_kubelet_key_is_accepted():
    config, ignored = read_kubelet_configuration({key: None for key in IGNORED_KUBELET_KEYS})
    assert set(ignored) == IGNORED_KUBELET_KEYS


def test_the_agent_names_the_ignored_keys_in_one_info_line(tmp_path: Path, caplog):
    path = tmp_path / "config.yaml"
    path.write_text(KUBEADM_CONFIG)
    with caplog.at_level(logging.INFO, logger="nri_numa.nri.daemon"):
        config = load_config(path)
    assert config.cpu_manager_policy is CpuManagerPolicy.STATIC
    lines = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(lines) == 1
    assert "evictionHard" in lines[0] and "staticPodPath" in lines[0]
    assert "cpuManagerPolicy" not in lines[0]


def test_a_typo_of_a_key_nri_numa_reads_is_refused_with_the_nearest_name():
    with pytest.raises(ConfigError) as e:
        read_kubelet_configuration(_yaml(KUBEADM_CONFIG + "topologyManagerScop: pod\n"))
    assert e.value.problems[0].startswith(
        "unknown key 'topologyManagerScop'; did you mean topologyManagerScope?")


def test_a_typo_of_a_kubelet_key_names_the_kubelet_key():
    with pytest.raises(ConfigError) as e:
        read_kubelet_configuration({"evictonHard": {}})
    assert "did you mean evictionHard?" in e.value.problems[0]


def test_unknown_keys_under_nriNuma_are_still_refused(tmp_path: Path):
    from nri_numa.agent.settings import SettingsError, resolve

    path = tmp_path / "config.yaml"
    path.write_text(KUBEADM_CONFIG + "nriNuma:\n  logLevl: debug\n")
    document = read_config_document(path)
    with pytest.raises(SettingsError, match="did you mean logLevel"):
        resolve(document.settings, str(path), {})


def test_every_problem_of_a_file_is_in_its_one_line():
    # Before: the static-without-reserved problem appeared only once the others were fixed.
    text = ("cpuManagerPolicy: static\n"
            "topologyManagerPolcy: restricted\n"
            "memoryManagerPolicy: Statc\n"
            "evictonHard: {}\n")
    with pytest.raises(InputFileError) as e:
        config_from_text(text, "config.yaml")
    line = str(e.value)
    assert "\n" not in line
    assert "did you mean topologyManagerPolicy?" in line
    assert "did you mean evictionHard?" in line
    assert "memoryManagerPolicy:" in line
    assert "the static policy requires" in line


def test_a_check_on_a_refused_value_is_not_reported_twice():
    # reservedMemory's own check (the Static policy wants some) would judge the default that
    # replaced the refused value: only the refused value is reported.
    with pytest.raises(ConfigError) as e:
        read_kubelet_configuration({"memoryManagerPolicy": "Static", "reservedMemory": "1Gi"})
    assert [p.split(":")[0] for p in e.value.problems] == ["reservedMemory"]


def _yaml(text: str):
    import yaml

    return yaml.safe_load(text)


def test_the_ignored_keys_are_the_kubelets_and_no_others():
    """Every key named as ignored is a field of the 1.36 type, or of a later kubelet's."""
    later = {"defaultPodSysctls"}  # master after 1.36 (KEP-5996)
    keys_1_36 = set(_yaml(KUBELET_1_36.read_text())) - {"apiVersion", "kind"}
    assert IGNORED_KUBELET_KEYS == (keys_1_36 - RESOURCE_MANAGER_KEYS) | later
    # No kubelet has this one: it is refused, not silently ignored.
    with pytest.raises(ConfigError, match="unknown key 'draManagerReconcilePeriod'"):
        read_kubelet_configuration({"draManagerReconcilePeriod": "10s"})
