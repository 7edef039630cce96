"""nri-numa run reads the kubelet's CPU and Memory Manager checkpoints from --kubelet-state-dir
(default the kubelet's root) to adopt their placements; a missing or bad file is one warning,
never a failed start."""

from __future__ import annotations

import logging

from nri_numa.nri import daemon
from tests.unit.state.test_kubelet_checkpoints import CPU_V2, MEMORY_STATIC


def test_the_kubelets_checkpoint_is_read_from_the_folder_given(tmp_path, caplog):
    (tmp_path / "cpu_manager_state").write_text(CPU_V2)
    caplog.set_level(logging.INFO)
    state = daemon._kubelet_state(tmp_path)
    assert state is not None and state.cpu.policy == "static" and state.memory is None
    assert state.cpu.assignments == {("235148fe-393f-47a8-a17d-bd55bc1a836b", "cgroup1-0"): {1, 13}}
    assert "policy static, 1 containers placed" in caplog.text
    (tmp_path / "memory_manager_state").write_text(MEMORY_STATIC)
    state = daemon._kubelet_state(tmp_path)
    assert state.cpu is not None and state.memory.policy == "static"
    assert state.memory_of(*next(iter(state.memory.assignments))) is not None


def test_a_missing_or_damaged_checkpoint_is_one_warning_and_nothing_adopted(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    assert daemon._kubelet_state(tmp_path) is None
    (tmp_path / "cpu_manager_state").write_text(CPU_V2.replace("1552716370", "1552716371"))
    assert daemon._kubelet_state(tmp_path) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all("placed anew" in line for line in lines)
    assert "neither cpu_manager_state nor memory_manager_state" in lines[0]
    assert "checksum" in lines[1].lower()


def test_without_a_folder_the_kubelets_root_is_looked_at(tmp_path, monkeypatch):
    monkeypatch.setattr(daemon, "KUBELET_ROOT", tmp_path)
    assert daemon._kubelet_state(None) is None  # no file there: quietly nothing
    (tmp_path / "cpu_manager_state").write_text(CPU_V2)
    assert daemon._kubelet_state(None) is not None
