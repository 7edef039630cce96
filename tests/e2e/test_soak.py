"""The soak, short: `nri-numa run` for 3 minutes under seeded pod churn on a real containerd
2.1.9 (bench/soak.py: pods run and removed, Guaranteed, Burstable and BestEffort mixed, in-place
resizes, cpusets written behind the agent's back), sampled every 10 s. Growth is judged after
the first minute on the medians of the first and last 3 samples: RSS at most +5 %, open
descriptors at most +5 % (on about 8, that is none), threads none; the state folder never above
what compaction allows; the log at most 600 bytes a decision. No invariant may break:
`nri-numa state` exits 0 at every sample, no exclusive CPU is held twice, the checkpoint equals
the runtime's cgroups at the end and is empty once every pod is gone.

No timing is asserted: on a loaded 2-CPU machine the churn is slower, not wrong. About 4
minutes."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from bench.soak import Options, soak
from nri_numa.state.plugin_checkpoint import MIN_COMPACT_BYTES
from tests.e2e.harness.runtimes import Runtimes
from tests.e2e.nri_agent import require_two_cpus

pytestmark = pytest.mark.e2e
MINUTES, SAMPLE_S, WARMUP_MINUTES = 3.0, 10.0, 1.0
RSS_GROWTH, FD_GROWTH = 0.05, 0.05
LOG_BYTES_PER_DECISION = 600
WINDOW = 3  # samples in each median


def test_three_minutes_of_churn_leave_the_agent_flat_and_its_ledger_true(
        runtimes: Runtimes, tmp_path: Path) -> None:
    require_two_cpus()
    result = soak(Options(minutes=MINUTES, sample_seconds=SAMPLE_S,
                          warmup_minutes=WARMUP_MINUTES, rss_growth=RSS_GROWTH,
                          fd_growth=FD_GROWTH, log_bytes_per_decision=LOG_BYTES_PER_DECISION,
                          resize_chance=0.15, drift_chance=0.1, out=tmp_path / "soak"),
                  say=print)
    print("\n".join(result.notes))
    assert result.violations == []

    # The churn happened: every kind of event the soak drives reached the agent.
    counts = result.counts
    assert counts.placed_exclusive >= 1 and counts.placed_shared >= 5, counts
    assert counts.removed_by_container >= 1 and counts.removed_by_pod >= 1, counts
    assert counts.resized + counts.resizes_refused >= 1, counts
    assert counts.drifts_repaired >= 1, counts
    assert result.decision_lines["placed"] >= 6 and result.decision_lines["released"] >= 5
    assert counts.state_checks == len(result.samples)

    # The bounds, restated on the samples.
    after = [s for s in result.samples if s.t_s >= WARMUP_MINUTES * 60]
    assert len(after) >= 2 * WINDOW, [s.t_s for s in result.samples]

    def first_and_last(values: list[float]) -> tuple[float, float]:
        return statistics.median(values[:WINDOW]), statistics.median(values[-WINDOW:])

    rss_first, rss_last = first_and_last([s.rss_kb for s in after])
    assert rss_last <= rss_first * (1 + RSS_GROWTH)
    fds_first, fds_last = first_and_last([s.fds for s in after])
    assert fds_last <= fds_first * (1 + FD_GROWTH)
    threads_first, threads_last = first_and_last([s.threads for s in after])
    assert threads_last <= threads_first
    largest_snapshot = max(s.snapshot_bytes for s in result.samples)
    assert result.state_bound <= 2 * max(largest_snapshot, MIN_COMPACT_BYTES) + (64 << 10)
    assert max(s.state_bytes for s in result.samples) <= result.state_bound
    decided = after[-1].decisions - after[0].decisions
    assert decided > 0
    assert after[-1].log_bytes - after[0].log_bytes <= decided * LOG_BYTES_PER_DECISION
    assert (tmp_path / "soak" / "samples.csv").read_text().count("\n") == len(result.samples) + 1
