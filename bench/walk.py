"""The walk of one CreateContainer through the NRI plugin: which of nri_numa's modules it
visits, in order.

Run from the repository root:
    .venv/bin/python -m bench.walk [--preset NAME] [--running N] [--depth plugin|all]
        [--levels N] [--list]

The plugin is built as `nri-numa run` builds it (its checkpoint in a temporary folder, the
packaging example's configuration of bench/bench_nri_plugin.py) on a synthetic machine (default
``intel-2s-ht``) with ``--running`` containers placed (default 3); one more Guaranteed
container's CreateContainer is then traced with ``sys.setprofile``. The room at each moment is
the module of the innermost nri_numa frame; a *stay* is a run of consecutive moments in one
room, a *return* a stay in a room already left once (returns = stays − rooms). Frames outside
nri_numa (protobuf, the standard library) do not move the walker.

``--depth plugin`` (the default) counts the plugin's side only: the engine (nri_numa.engine.*)
is one room, entered through the ledger, as are the modules below every layer
(nri_numa.safeio.*, nri_numa.topology.*); ``--depth all`` counts every module. ``--levels N``
folds the frames more than N nri_numa calls below the handler into their caller at that depth.
``--list`` prints each stay. Figures: bench/README.md, "The walk of a CreateContainer".
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

from bench.bench_nri_plugin import CONFIG, kubernetes_container
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.daemon import plugin_store
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.topology.synthetic import preset_topology
from tests import nri_messages as msg

# Under --depth plugin, these packages are one room each.
LAYERS = ("nri_numa.engine", "nri_numa.safeio", "nri_numa.topology")


def room_of(module: str, depth: str) -> str:
    if depth == "plugin":
        for layer in LAYERS:
            if module == layer or module.startswith(layer + "."):
                return layer + ".*"
    return module


def trace(call: Callable[[], object], depth: str, levels: int | None) -> list[str]:
    """The rooms ``call()`` moves through, one entry per move (consecutive repeats merged).
    ``levels``: frames more than that many nri_numa calls below the first are counted in
    their caller's room at that level; None: no limit."""
    moves: list[str] = []
    stack: list[str | None] = []  # the live frames' rooms; None: a frame outside nri_numa

    def note() -> None:
        inside = [room for room in stack if room is not None]
        if levels is not None:
            inside = inside[:levels + 1]
        if inside and (not moves or moves[-1] != inside[-1]):
            moves.append(inside[-1])

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            stack.append(room_of(module, depth) if module.startswith("nri_numa.") else None)
        elif event == "return" and stack:
            stack.pop()
        else:
            return
        note()

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return moves


def walk(preset: str, running: int, depth: str, levels: int | None) -> list[str]:
    topology = preset_topology(preset)
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="nri-numa-walk-") as folder:
        plugin = NumaPlugin(topology, config_from_mapping(CONFIG),
                            plugin_store(Path(folder), topology))
        for i in range(running):
            plugin.create_container(msg.create(*kubernetes_container(rng, i)))
        sandbox = msg.pod("walked", "guaranteed", uid="0000walk-6d2b-4a53-9d53-3b8c1f2e9a71")
        container = msg.guaranteed(sandbox, "app", 2, cid="walk" + "0" * 60,
                                   state=api.CONTAINER_CREATED)
        request = msg.create(sandbox, container)
        moves = trace(lambda: plugin.create_container(request), depth, levels)
    return moves


def summary(moves: list[str]) -> tuple[int, int, int, dict[str, int]]:
    """Rooms, stays, returns, and the returns by room."""
    seen: set[str] = set()
    returns: dict[str, int] = {}
    for room in moves:
        if room in seen:
            returns[room] = returns.get(room, 0) + 1
        seen.add(room)
    return len(seen), len(moves), len(moves) - len(seen), returns


def lines(moves: list[str], listing: bool) -> Iterator[str]:
    rooms, stays, back, returns = summary(moves)
    if listing:
        yield from (f"{i:3d} {room}" for i, room in enumerate(moves, 1))
    yield f"rooms {rooms}, stays {stays}, returns {back}"
    for room, count in sorted(returns.items(), key=lambda item: (-item[1], item[0])):
        yield f"  returns to {room}: {count}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="intel-2s-ht")
    parser.add_argument("--running", type=int, default=3)
    parser.add_argument("--depth", choices=("plugin", "all"), default="plugin")
    parser.add_argument("--levels", type=int, default=None,
                        help="count frames at most this many nri_numa calls below the handler")
    parser.add_argument("--list", action="store_true", help="print each stay")
    args = parser.parse_args(argv)
    # The decision lines are built, as the agent builds them, and thrown away.
    log = logging.getLogger("nri_numa")
    log.setLevel(logging.INFO)
    log.addHandler(logging.FileHandler(os.devnull))
    log.propagate = False
    for line in lines(walk(args.preset, args.running, args.depth, args.levels), args.list):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
