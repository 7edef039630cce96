"""The configuration a checkpoint records, and how a change is described."""

from __future__ import annotations

from pathlib import Path

import pytest

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.state.checkpoint import CheckpointError
from nri_numa.state.plugin_records import RecordError
from nri_numa.state.recorded_config import RecordedConfig, refuse_change


def recorded(reserved: frozenset[int] = frozenset({0}), **keys) -> RecordedConfig:
    config = config_from_mapping({"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
                                  **keys})
    return RecordedConfig.of(config, reserved)


def test_round_trip_and_no_change():
    r = recorded(frozenset({0, 64}))
    assert r.to_dict() == {"topologyManagerPolicy": "none", "cpuManagerPolicy": "static",
                           "memoryManagerPolicy": "None", "reservedCPUs": "0,64"}
    assert RecordedConfig.from_dict(r.to_dict()) == r
    assert r.changes_to(RecordedConfig.from_dict(r.to_dict())) == []


def test_changes_name_old_and_new():
    before = recorded()
    after = recorded(frozenset(), topologyManagerPolicy="restricted")
    assert before.changes_to(after) == ["topologyManagerPolicy 'none' → 'restricted'",
                                        "reservedCPUs '0' → \"\""]


@pytest.mark.parametrize("raw, message", [
    ([], "config must be an object, not list"),
    ({"topologyManagerPolicy": "none"}, "config.cpuManagerPolicy must be a string, not None"),
    ({"topologyManagerPolicy": "none", "cpuManagerPolicy": "static",
      "memoryManagerPolicy": "None", "reservedCPUs": "x"}, "config.reservedCPUs:"),
])
def test_a_bad_record_is_named(raw, message):
    with pytest.raises(RecordError, match=message):
        RecordedConfig.from_dict(raw)


def test_the_refusal_says_how_to_drain():
    error = refuse_change(Path("/var/lib/nri-numa/checkpoint.json"),
                          ["cpuManagerPolicy 'static' → 'none'"], 2)
    assert isinstance(error, CheckpointError)  # the daemon's start-up errors catch it
    text = str(error)
    assert "holds the placements of 2 containers: cpuManagerPolicy 'static' → 'none'." in text
    assert "drain this node" in text and "delete /var/lib/nri-numa/checkpoint.json" in text
