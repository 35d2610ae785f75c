"""A pytest plugin that prints each failure's traceback the moment the test fails.

Why: the GPU machine's calls end at a hard time limit, and pytest prints tracebacks only in
its final summary, so a run cut short by the limit showed a test FAILED with no reason
(stop 43 lost two that way). `tools/gpu_run.py` loads it with `-p`.
"""

from __future__ import annotations


def pytest_runtest_logreport(report) -> None:
    """Print a failed phase's report (setup, call or teardown) as soon as it is made."""
    if report.failed:
        print(f"\n==== FAILED {report.nodeid} ({report.when}) ====", flush=True)
        print(report.longreprtext, flush=True)
        print("==== end of failure ====", flush=True)
