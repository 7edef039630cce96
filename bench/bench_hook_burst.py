"""A burst of container starts through real runc with nri-numa's OCI hooks, as a node sees one
when a deployment scales up: N containers created and started at once, then deleted at once.
Root, runc and busybox-static needed (as the OCI hook e2e tests).

Run from the repository root:
    .venv/bin/python -m bench.bench_hook_burst [--containers 50] [--exclusive 5] [--rounds 1]
                                               [--modes in-process,daemon,on-demand]

The hooks are hooks/runc-config.example.json's, with its timeouts, only the paths changed
(tests/e2e/harness/hook_burst.py). Modes:

* ``in-process``: no hook daemon, and the hooks without ``--start-daemon``: every hook loads the
  engine itself (the fallback);
* ``daemon``: ``nri-numa hook-daemon`` started (and warm) before the burst, as the systemd units
  keep it;
* ``on-demand``: no daemon before the burst; the first hook starts one (``--start-daemon``).

Per mode: how many containers started, were refused with nri-numa's reason, or were killed by
runc at its hook timeout; p50/p99/max of the hook runs (from the hook log, each counted from its
process's start) per stage; the burst's wall time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.harness import hook_burst as hb
from tests.e2e.harness.runtimes import find_busybox

MODES = ("in-process", "daemon", "on-demand")


def run_mode(lab: hb.BurstLab, mode: str, containers: int, exclusive: int,
             timeouts: tuple[float, float] | None = None) -> dict:
    hooks = hb.documented_hooks(lab, drop=["--start-daemon"])
    for entries in hooks.values():
        for hook in entries:
            if mode == "on-demand":
                hook["args"].append("--start-daemon")
            if timeouts is not None:  # (the runtime's, the hook's own)
                hook["timeout"] = int(timeouts[0])  # runc reads an integer
                hook["args"][hook["args"].index("--timeout") + 1] = f"{timeouts[1]:g}"
    names = [f"{mode[:2]}{i}" for i in range(containers)]
    for i, name in enumerate(names):
        hb.write_bundle(lab, name, 1 if i < exclusive else 0, hooks)
    daemon = None
    if mode == "daemon":
        nice = os.environ.get("BENCH_DAEMON_NICE")
        daemon = subprocess.Popen([*(["nice", "-n", nice] if nice else []), str(lab.hook),
                                   "hook-daemon", "--state-dir", str(lab.state),
                                   "--config", str(lab.config)])
        while not (lab.state / "hook.sock").exists():
            time.sleep(0.05)
    log_from = lab.log.stat().st_size if lab.log.exists() else 0
    try:
        started = time.monotonic()
        created = hb.at_once(lab, names, ["run", "--detach"])
        create_wall = time.monotonic() - started
        held = len(lab.ledger()["records"]["containers"])
        started = time.monotonic()
        deleted = hb.at_once(lab, names, ["delete", "--force"])
        delete_wall = time.monotonic() - started
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=30)
        hb.stop_daemons(lab.state)
    with open(lab.log, "rb") as f:
        f.seek(log_from)
        runs = hb.hook_runs(f.read().decode())
    return {"created": created, "deleted": deleted, "runs": runs, "held": held,
            "left": len(lab.ledger()["records"]["containers"]),
            "create_wall": create_wall, "delete_wall": delete_wall}


def report(mode: str, result: dict) -> None:
    created, deleted = result["created"], result["deleted"]
    ok = sum(o.returncode == 0 for o in created.values())
    killed = sum(hb.KILLED in o.stderr for o in created.values())
    refused = sum(o.returncode != 0 and "nri-numa hook createRuntime:" in o.stderr
                  for o in created.values())
    other = len(created) - ok - killed - refused
    killed_stop = sum(hb.KILLED in o.stderr for o in deleted.values())
    print(f"{mode}: {len(created)} containers: {ok} started, {refused} refused by nri-numa, "
          f"{killed} killed at the hook timeout, {other} other; in the ledger after the burst: "
          f"{result['held']}, after the deletes: {result['left']}; poststop killed: "
          f"{killed_stop}; walls: create {result['create_wall']:.1f} s, delete "
          f"{result['delete_wall']:.1f} s")
    reasons: dict[str, int] = {}
    for o in created.values():
        if o.returncode != 0:
            reason = o.stderr.split("nri-numa hook createRuntime: ")[-1][:90].strip()
            reasons[reason] = reasons.get(reason, 0) + 1
    for reason, count in sorted(reasons.items(), key=lambda r: -r[1]):
        print(f"    {count:3d} × {reason}")
    for stage in ("createRuntime", "poststop"):
        ms = [r.ms for r in result["runs"] if r.stage == stage]
        p50, p99, top = hb.percentiles(ms)
        fails = sum(not r.ok for r in result["runs"] if r.stage == stage)
        print(f"    {stage:13s} runs {len(ms):3d} (failed {fails:2d}): p50 {p50:5.0f} ms, "
              f"p99 {p99:5.0f} ms, max {top:5.0f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--containers", type=int, default=50)
    parser.add_argument("--exclusive", type=int, default=5,
                        help="how many of them ask for one exclusive CPU (the rest: BestEffort)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--timeouts", metavar="RUNTIME,OWN",
                        help="the runtime's hook timeout and the hook's --timeout to try "
                             "instead of the shipped ones")
    parser.add_argument("--hook", type=Path, default=Path(sys.executable).with_name("nri-numa"),
                        help="the nri-numa executable the hooks run (another build, to compare)")
    parser.add_argument("--background", type=int, default=0,
                        help="CPU-bound processes kept running through each burst (another "
                             "workload on the node)")
    args = parser.parse_args()
    hook = args.hook
    timeouts = None
    if args.timeouts:
        runtime_s, own_s = args.timeouts.split(",")
        timeouts = (float(int(runtime_s)), float(own_s))
    runtime, own = timeouts or hb.hook_timeouts()
    print(f"hooks: runtime timeout {runtime:g} s, --timeout {own:g} s"
          f"{'' if timeouts else ' (as shipped)'}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
          f"{args.background} CPU-bound processes beside")
    results: dict[str, list[dict]] = {}
    for round_ in range(args.rounds):
        for mode in args.modes.split(","):
            lab = hb.make_lab(hook, find_busybox())
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                        for _ in range(args.background)]
            try:
                result = run_mode(lab, mode, args.containers, args.exclusive, timeouts)
            finally:
                for spinner in spinners:
                    spinner.kill()
                    spinner.wait()
                hb.cleanup(lab)
            report(mode, result)
            results.setdefault(mode, []).append(result)
    summary(results)
    return 0


def summary(results: dict[str, list[dict]]) -> None:
    """All rounds together, as docs/oci-hook.md gives them: the hook runs of every round pooled
    for the percentiles."""
    print("\n| mode | rounds | started | refused by nri-numa | hooks killed by runc | "
          "createRuntime p50 / p99 / max | poststop p50 / p99 / max |\n"
          "|---|---|---|---|---|---|---|")
    for mode, rounds in results.items():
        created = [o for r in rounds for o in r["created"].values()]
        started = sum(o.returncode == 0 for o in created)
        refused = sum(o.returncode != 0 and "nri-numa hook createRuntime:" in o.stderr
                      for o in created)
        killed = sum(hb.KILLED in o.stderr for r in rounds
                     for o in [*r["created"].values(), *r["deleted"].values()])
        cells = []
        for stage in ("createRuntime", "poststop"):
            p50, p99, top = hb.percentiles([run.ms for r in rounds for run in r["runs"]
                                            if run.stage == stage])
            cells.append(f"{p50 / 1000:.1f} / {p99 / 1000:.1f} / {top / 1000:.1f} s")
        print(f"| {mode} | {len(rounds)} | {started} | {refused} | {killed} | {cells[0]} | "
              f"{cells[1]} |")


if __name__ == "__main__":
    sys.exit(main())
