"""The rank launcher turns a hang, a crash and a vanished rank into a problem, never a wait."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("rank_targets.py")


@pytest.mark.timeout(150)
def test_a_lost_rank_is_a_problem_not_a_wait():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "ok", "big", "hang", "crash", "exit"],
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert out.returncode == 0, out.stderr
    seen = {
        line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in out.stdout.splitlines()
    }
    for mode in ("ok", "big"):  # "big": a 256 KiB answer, past any pipe buffer
        assert seen[mode]["got"] == [[0, 0], [1, 10]], mode
        assert seen[mode]["problem"] == "", mode
    assert seen["big"]["blob"] == 1 << 18
    expected = {
        "hang": "no answer from rank(s) 1 within 3 s (hang)",
        "crash": "rank 1 crashed: RuntimeError: boom on purpose",
        "exit": "process ended early: rank 1 (exit 7)",
    }
    for mode, problem in expected.items():
        assert seen[mode]["got"] == [[0, 0]], (mode, seen[mode])
        assert seen[mode]["problem"] == problem
        assert seen[mode]["seconds"] < 20, mode  # the hung rank is ended, not waited for
