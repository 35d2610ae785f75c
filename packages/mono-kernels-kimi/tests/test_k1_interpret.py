"""K1's Triton build under the interpreter at tiny shapes, against the reference.

Spec-verify steps of R requests x L tokens (a cover of R x L <= 8 by default, every one
with MONO_K1_ALL_CASES=1; see interp_cases.py), 16 rows and plain decodes, with fresh random
weights, caches and slots; padded requests (slot -1 or vLLM's null block 0).
The kernels run in one child process (TRITON_INTERPRET=1 must never leak into this
one, where GPU tests may be collected); each test asserts on its case's measurements.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mono_peer.testing import child_json

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from interp_cases import cases  # noqa: E402

NAMES = [c[0] for c in cases()]


@pytest.fixture(scope="module")
def results():
    """Every case, in two children side by side (the interpreter uses one core; CI has
    two), the cases dealt out by rows so that both take about as long."""
    by_rows = sorted(cases(), key=lambda c: -c[1] * c[2])
    halves = [[c[0] for c in by_rows[0::2]] + ["warm"], [c[0] for c in by_rows[1::2]] + ["giveup"]]

    def run(names):
        argv = [str(HERE / "interp_cases.py"), *names]
        return child_json(argv, 280, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")[0]

    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(run, halves))
    return got[0] | got[1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", NAMES)
def test_k1_matches_reference(results, name):
    m = results[name]
    assert m["core"] < 1e-2, m
    assert m["state"] < 1e-3, m
    assert m["conv"] < 1e-3, m
    assert m["prefix"] and m["blocks"], m  # AttnRes writes match bit for bit
    assert m["written"], m  # every spec slot holds its token's state
    assert m["untouched"], m  # padded requests and unowned slots: nothing written
    assert m["pad_zero"] and m["finite"], m
    assert m["tickets"] == 0 and m["giveups"] == 0, m  # counter reset, no wait gave up


@pytest.mark.timeout(300)
def test_warm_launches_every_width_and_flag(results):
    m = results["warm"]
    assert m["builds"] == sorted([1, d, w] for d, w in m["flags"]), m
    assert m["tickets"] == 0 and m["giveups"] == 0, m


@pytest.mark.timeout(300)
def test_a_wait_that_gives_up_ends_the_launch_and_raises(results):
    m = results["giveup"]
    # stage 2 waited for stage 1's item 0, in the runner's health words
    assert "deadline at kda.ares pair 0" in m["raised"], m
    assert m["tickets_after"] == 0, m  # the launch ended and reset its ticket counter
    assert m["out_nan"] and m["state_kept"], m  # poisoned output, no state from garbage
    assert m["core_after_reset"] < 1e-2 and m["giveups_after_reset"] == 0, m
