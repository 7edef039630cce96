"""A process for tests/integration/nri/test_journal_kill.py: the NRI plugin with its checkpoint
as `nri-numa run` makes it (``plugin_store``: snapshot and journal in a state folder, no fsync),
creating containers of pods FIRST..LAST-1 one at a time (every tenth Guaranteed with one CPU,
the rest BestEffort). After each CreateContainer has answered it prints ``ACK <id> <cpus>``
(``REFUSED <id>`` for a refusal), then ``DONE``, and waits to be killed.

    python -m tests.integration.nri.journal_child STATE_DIR FIRST LAST
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.daemon import plugin_store
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.nri.session import PluginError
from nri_numa.state import plugin_checkpoint
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import CONFIG, machine


def container_of(i: int):
    if i % 10 == 0:
        sandbox = msg.pod(f"g{i}")
        return sandbox, msg.guaranteed(sandbox, "app", 1, cid=f"c{i}")
    sandbox = msg.pod(f"be{i}", "besteffort")
    return sandbox, msg.container(sandbox, "app", cid=f"c{i}")


def main(argv: list[str]) -> None:
    state_dir, first, last = Path(argv[0]), int(argv[1]), int(argv[2])
    # A compaction after ~50 creations rather than ~800: the kill test waits for one.
    plugin_checkpoint.MIN_COMPACT_BYTES = 64 << 10
    topology = machine()
    plugin = NumaPlugin(topology, config_from_mapping(CONFIG), plugin_store(state_dir, topology))
    print("STARTED", flush=True)
    for i in range(first, last):
        sandbox, c = container_of(i)
        try:
            reply = plugin.create_container(msg.create(sandbox, c))
        except PluginError:
            print(f"REFUSED {c.id}", flush=True)
            continue
        print(f"ACK {c.id} {reply.adjust.linux.resources.cpu.cpus}", flush=True)
    print("DONE", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
