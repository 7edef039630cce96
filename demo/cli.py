"""The demo's command line, `python -m demo [--smoke] [--containerd 1.7|2.1]`. Exit status: 0
when every placement checks out, 1 when one does not (or the demo failed, or clean-up left
something), 2 when this machine cannot run the demo, 130 on Ctrl-C, 128+N on signal N."""

from __future__ import annotations

import argparse
import sys

from demo.checks import check_placements
from demo.cleanup import Interrupted, install_signal_handlers
from demo.preflight import SHORT_VERSIONS, DemoUnavailable
from demo.rows import GUARANTEED, DemoResult
from demo.run import DemoFailed, run_demo
from demo.table import explain, render_table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/demo",
        description="Run a Guaranteed, a Burstable and a BestEffort pod through a private "
                    "containerd with the nri-numa NRI plugin and show where each landed, read "
                    "back from the cgroups. Needs root; removes everything it started.")
    parser.add_argument("--smoke", action="store_true",
                        help="no table: check the placements and say ok, or what is wrong")
    parser.add_argument("--containerd", default="2.1", choices=sorted(SHORT_VERSIONS),
                        help="the containerd version to run (default 2.1)")
    return parser.parse_args(argv)


def report(result: DemoResult, smoke: bool) -> list[str]:
    """Prints the outcome; returns the problems that make the exit status 1."""
    problems = check_placements(result.rows, result.machine, result.besteffort_before)
    problems += [f"clean-up: {p}" for p in result.cleanup_problems]
    if not smoke:
        print()
        print(render_table(result.rows))
        print()
        for line in explain(result) if not problems else ():
            print(line)
        if result.plugin_lines:
            print("The plugin's log said:")
            for line in result.plugin_lines:
                print(f"  {line}")
    if problems:
        print(f"demo: FAILED, {len(problems)} problem(s):", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return problems
    guaranteed = next(r for r in result.rows if r.qos == GUARANTEED)
    shared = next(r for r in result.rows if r.qos != GUARANTEED)
    print(f"demo: ok on containerd {result.containerd_version} in {result.seconds:.1f} s: "
          f"{guaranteed.pod} on CPU {guaranteed.cpus} alone, the other two share CPU {shared.cpus}")
    return []


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    try:
        result = run_demo(args.containerd, sys.stderr)
    except DemoUnavailable as exc:
        print(f"demo: cannot run here: {exc}", file=sys.stderr)
        return 2
    except DemoFailed as exc:
        print(f"demo: FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo: interrupted; what it had started is removed", file=sys.stderr)
        return 130
    except Interrupted as exc:
        print(f"demo: {exc}; what it had started is removed", file=sys.stderr)
        return 128 + exc.signum
    return 1 if report(result, args.smoke) else 0
