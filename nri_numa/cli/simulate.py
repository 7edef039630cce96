"""``nri-numa simulate``: run a pods file through the engine on a machine, in order."""

from __future__ import annotations

import argparse

from nri_numa.cli.pods_input import add_engine_options, engine_inputs, report_bad_entries


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="what would happen to these pods on this machine",
                       description="Run the pods of a file, in order, through the placement "
                                   "engine: where each container would go, or why not.")
    add_engine_options(p)
    p.add_argument("--json", action="store_true",
                   help="every step as JSON (decisions, shared pool, per-node summary)")
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    from nri_numa.views.simulate import simulate
    from nri_numa.views.simulate_render import render_json, render_text

    ctx, entries = engine_inputs(args)
    sim = simulate(ctx, entries)
    print(render_json(sim) if args.json else render_text(sim))
    return report_bad_entries(args.pods, sim.errors)
