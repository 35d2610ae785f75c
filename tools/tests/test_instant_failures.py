"""The GPU runner's pytest plugin prints a failure's traceback when the test fails, before
pytest's own summary (which a run stopped at the time limit never reaches)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = """
def test_fails():
    assert 1 == 2, "the reason"

def test_passes_after():
    pass
"""


@pytest.mark.timeout(120)
def test_traceback_comes_before_the_summary(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "mono_tools.instant_failures", "-p",
         "no:cacheprovider", "-q", str(tmp_path / "test_cases.py")],
        capture_output=True, text=True, timeout=100, cwd=tmp_path,
    )  # fmt: skip
    out = run.stdout
    assert run.returncode == 1, out
    early = out.index("==== FAILED ")
    assert "test_fails (call)" in out[early : early + 200]
    assert "the reason" in out[early : out.index("==== end of failure ====")]
    assert early < out.index("short test summary")
