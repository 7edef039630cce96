"""Where the end-to-end tiers must run (``NRI_NUMA_E2E_REQUIRED=1``, set by .ci/run), a skip is
a failure with its reason: a skipped end-to-end test proves nothing and must not pass as green.
Each tier's conftest calls ``fail_skip_where_required`` from its report hook."""

from __future__ import annotations

import os

import pytest

E2E_REQUIRED_ENV = "NRI_NUMA_E2E_REQUIRED"


def fail_skip_where_required(report: pytest.TestReport) -> None:
    if report.skipped and os.environ.get(E2E_REQUIRED_ENV) == "1":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped, but {E2E_REQUIRED_ENV}=1 says it must run here: {reason}"
