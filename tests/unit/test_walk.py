"""bench/walk.py, the walk of a CreateContainer through the plugin's modules: its counting, and
a real walk that starts and ends in the handler."""

from __future__ import annotations

from bench.walk import summary, walk

PLUGIN = "nri_numa.nri.plugin"


def test_a_return_is_a_stay_in_a_room_already_left():
    assert summary(["a", "b", "a", "c", "a", "b"]) == (3, 6, 3, {"a": 2, "b": 1})


def test_a_create_container_walks_from_the_handler_back_to_it():
    moves = walk("intel-2s-ht", 1, "plugin", None)
    assert moves[0] == moves[-1] == PLUGIN
    assert {"nri_numa.nri.translate", "nri_numa.state.plugin_records",
            "nri_numa.engine.*"} <= set(moves)
    assert not any(m.startswith("nri_numa.engine.") and m != "nri_numa.engine.*" for m in moves)
    assert walk("intel-2s-ht", 1, "plugin", 0) == [PLUGIN]  # every call folded into the handler
