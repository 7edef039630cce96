"""``nri-numa presets``: the synthetic machines, one line each."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("presets", help="list the synthetic machines")
    p.set_defaults(func=cmd_presets)


def cmd_presets(args: argparse.Namespace) -> int:
    from nri_numa.topology.synthetic import PRESETS

    width = max(len(name) for name in PRESETS)
    for name, preset in PRESETS.items():
        print(f"{name.ljust(width)}  {preset.summary}")
    return 0
