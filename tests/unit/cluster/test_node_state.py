"""The published node state: an exact round trip, bounded sizes, one-line errors."""

from __future__ import annotations

import base64
import zlib

import pytest

from nri_numa.cluster.node_state import (ANNOTATION, MAX_TEXT, NodeStateError, decode, encode)
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.manifest import container_from_resources
from nri_numa.engine.request import PodRequest
from nri_numa.state.ledger import Ledger
from nri_numa.topology.synthetic.presets import preset_topology

CONFIG = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0", "kubeReserved":
          {"memory": "1Gi"}, "topologyManagerPolicy": "single-numa-node",
          "topologyManagerScope": "pod", "memoryManagerPolicy": "Static",
          "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}],
          "cpuManagerPolicyOptions": {"full-pcpus-only": "true"}}


def guaranteed(uid: str, cpu: str, memory: str = "1Gi") -> PodRequest:
    main = container_from_resources("main", "app", {}, {"cpu": cpu, "memory": memory})
    return PodRequest(uid=uid, namespace="default", name=uid, app_containers=(main,))


def filled(preset: str, pods: int) -> Ledger:
    ledger = Ledger(EngineContext.build(preset_topology(preset), config_from_mapping(CONFIG)))
    for i in range(pods):
        ledger.admit(guaranteed(f"pod-{i:04d}-0123456789abcdef", "2"))
    return ledger


def test_round_trip_gives_equal_values_and_the_same_text():
    ledger = filled("amd-epyc-2s-nps4", 40)
    text = encode(ledger.ctx.topology, ledger.ctx.config, ledger.allocations, 7)
    state = decode(text)
    assert state.generation == 7
    assert state.topology == ledger.ctx.topology
    assert state.config == ledger.ctx.config
    assert state.allocations == ledger.allocations
    assert encode(state.topology, state.config, state.allocations, 7) == text


@pytest.mark.parametrize("preset", ["dgx-h100", "amd-epyc-2s-nps4", "gb200"])
def test_a_full_node_fits_in_an_annotation(preset):
    ledger = filled(preset, 500)  # more than the kubelet's 110 pods per node
    text = encode(ledger.ctx.topology, ledger.ctx.config, ledger.allocations, 1)
    assert len(text) < MAX_TEXT // 2


def _packed(raw: bytes) -> str:
    return "v1:" + base64.b64encode(zlib.compress(raw)).decode()


@pytest.mark.parametrize(("text", "expected"), [
    (None, "must be a string"),
    ("v9:abc", "version 'v9'"),
    ("v1:@@@", "not base64"),
    ("v1:" + base64.b64encode(b"plain").decode(), "not zlib"),
    ("v1:" + base64.b64encode(zlib.compress(b"{}")[:-3]).decode(), "cut short"),
    (_packed(b"[1]"), "must hold an object"),
    (_packed(b'{"topology":{}}'), "has no allocations, config, generation"),
    (_packed(b"[" * 100 + b"]" * 100), "nested deeper"),
    (_packed(b" " * (40 * 1024 * 1024)), "inflates to more than"),
    ("v1:" + "A" * MAX_TEXT, "more than"),
    (_packed(b'{"topology":{},"config":{},"allocations":{},"generation":-1}'), "generation"),
    (_packed(b'{"topology":{},"config":{},"allocations":{},"generation":1}'), "topology"),
])
def test_bad_text_is_one_line_naming_the_problem(text, expected):
    with pytest.raises(NodeStateError) as e:
        decode(text)
    message = str(e.value)
    assert expected in message and "\n" not in message and message.startswith(ANNOTATION)
