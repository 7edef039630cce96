"""The kubelet's cpu_manager_state and memory_manager_state read as the kubelet writes them: the
checksums below are the kubelet's own: CPU_V1 and MEMORY_STATIC from upstream's checkpoint
tests (pkg/kubelet/cm/{cpumanager,memorymanager}/state/state_checkpoint_test.go), CPU_V2,
CPU_NONE_V1 and MEMORY_NONE from files kubelets wrote on nodes (quoted in public notes on the
static policy), so the go-spew printing rebuilt here is checked against the kubelet's, not
against itself."""

from __future__ import annotations

import json

import pytest

from nri_numa.state.kubelet_checkpoints import (KubeletCheckpointError, MemoryBlock,
                                                read_cpu_state, read_memory_state)

CPU_V1 = ('{"policyName":"static","defaultCPUSet":"7-9","entries":{"containerID1":"4-6",'
          '"containerID2":"1-3"},"checksum":2026311253}')
CPU_V2 = ('{"policyName":"static","defaultCpuSet":"0,2-12,14-23","entries":{"235148fe-393f-'
               '47a8-a17d-bd55bc1a836b":{"cgroup1-0":"1,13"}},"checksum":1552716370}')
CPU_NONE_V1 = '{"policyName":"none","defaultCpuSet":"","checksum":3242152201}'
MEMORY_STATIC = ('{"policyName":"static","machineState":{"0":{"numberOfAssignments":0,'
                 '"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,'
                 '"reserved":512,"free":1024}},"cells":[]}},"entries":{"pod":{"container1":'
                 '[{"numaAffinity":[0],"type":"memory","size":512}]}},"checksum":4215593881}')
MEMORY_NONE = '{"policyName":"None","machineState":{},"checksum":4236770233}'


def write(tmp_path, text, name="cpu_manager_state"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_v2_as_upstream_writes_it(tmp_path):
    state = read_cpu_state(write(tmp_path, CPU_V2))
    assert state.format == "v2" and state.policy == "static"
    assert state.default_cpus == {0, *range(2, 13), *range(14, 24)}
    assert state.assignments == {("235148fe-393f-47a8-a17d-bd55bc1a836b", "cgroup1-0"): {1, 13}}


def test_v1_keyed_by_container_id(tmp_path):
    state = read_cpu_state(write(tmp_path, CPU_V1))
    assert state.format == "v1"
    assert state.assignments == {("", "containerID1"): {4, 5, 6}, ("", "containerID2"): {1, 2, 3}}


def test_v1_without_entries_as_a_kubelet_wrote_it(tmp_path):
    state = read_cpu_state(write(tmp_path, CPU_NONE_V1))
    assert (state.policy, state.format, state.default_cpus, state.assignments) == (
        "none", "v1", frozenset(), {})


def test_a_zero_checksum_is_accepted_as_the_kubelet_accepts_it(tmp_path):
    doc = json.loads(CPU_V1) | {"checksum": 0, "defaultCPUSet": "5"}
    assert read_cpu_state(write(tmp_path, json.dumps(doc))).default_cpus == {5}


@pytest.mark.parametrize("change", [{"checksum": 1552716371}, {"defaultCpuSet": "0,2-12"},
                                    {"entries": {"235148fe-393f-47a8-a17d-bd55bc1a836b":
                                                 {"cgroup1-0": "1"}}}])
def test_a_changed_file_is_refused_in_one_line(tmp_path, change):
    doc = json.loads(CPU_V2) | change
    with pytest.raises(KubeletCheckpointError) as e:
        read_cpu_state(write(tmp_path, json.dumps(doc)))
    assert "checksum" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, words", [
    ("{", "not JSON"), ("[]", "not a JSON object"), ('{"entries": 3}', "entries"),
    ('{"entries": {"a": 1}}', "neither"), ('{"policyName": 1}', "policyName"),
    ('{"defaultCpuSet": "x", "checksum": 0}', "defaultCpuSet"),
    ('{"data": "{}", "dataChecksum": 1}', "data section")])
def test_bad_cpu_files_are_one_line(tmp_path, text, words):
    with pytest.raises(KubeletCheckpointError) as e:
        read_cpu_state(write(tmp_path, text))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(KubeletCheckpointError, match="No such file"):
        read_cpu_state(tmp_path / "cpu_manager_state")


def test_memory_static_as_upstream_writes_it(tmp_path):
    state = read_memory_state(write(tmp_path, MEMORY_STATIC, "memory_manager_state"))
    assert state.policy == "static"
    assert state.assignments == {("pod", "container1"): (MemoryBlock(frozenset({0}), "memory",
                                                                     512),)}


def test_memory_none_as_a_kubelet_wrote_it(tmp_path):
    assert read_memory_state(write(tmp_path, MEMORY_NONE, "m")).assignments == {}


def test_a_changed_memory_file_is_refused(tmp_path):
    doc = json.loads(MEMORY_STATIC)
    doc["entries"]["pod"]["container1"][0]["size"] = 1024
    with pytest.raises(KubeletCheckpointError, match="checksum"):
        read_memory_state(write(tmp_path, json.dumps(doc), "m"))


@pytest.mark.parametrize("text", ['{"machineState": []}', '{"entries": {"p": {"c": [{"type": 1}]}}}',
                                  '{"entries": {"p": 3}}'])
def test_bad_memory_files_are_one_line(tmp_path, text):
    with pytest.raises(KubeletCheckpointError) as e:
        read_memory_state(write(tmp_path, text, "m"))
    assert "\n" not in str(e.value)
