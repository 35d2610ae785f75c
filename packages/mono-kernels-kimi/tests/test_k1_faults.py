"""A K1 wait that gives up while serving is never silent (issue 14): it lands in the rank
runner's health words, so `after_step()` raises MonoFault (on every rank, through the TP
fault handshake of the step's final launch), `guard()` poisons the hidden states before
the logits, and the layer writes NaN and no cache. Faults are injected mid-serving, on
the CPU interpreter: a lost work item on one rank, and a late rank (the runtime's fault
injection) at TP 2. Each runs in child processes (k1_serving.py), every wait bounded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mono_peer.testing import spawn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import k1_serving  # noqa: E402

ENV = {"TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}


def _served(r, why):
    assert r["fault"] is None, f"{why}: {r['fault']}"
    assert r["hidden_finite"], f"{why}: the guard poisoned a good step"
    assert r["out_err"] < 1e-2 and r["state_err"] < 1e-3, f"{why}: {r}"


@pytest.mark.timeout(120)
def test_a_give_up_while_serving_raises_in_after_step_and_poisons_the_step():
    ok, faulted, after_reset, tickets = spawn(k1_serving.lost_item, 1, 100, env=ENV)[0]
    _served(ok, "step 1")
    fault = faulted["fault"]
    assert fault is not None, "a K1 wait gave up and after_step() said nothing"
    assert "deadline at kda.ares pair 0" in fault and "slot 1" in fault, fault
    assert faulted["hidden_nan"], "guard() let the faulted step's hidden states through"
    assert faulted["out_nan"] == [False, True], faulted  # the second launch gave up
    assert faulted["state_kept"][1], "a layer whose waits gave up wrote its caches"
    _served(after_reset, "step 3, after reset()")
    assert tickets == 0, "a launch left its ticket counter drawn"


@pytest.mark.timeout(150)
def test_a_late_rank_faults_every_rank_in_the_same_step():
    results = spawn(k1_serving.late_rank, 2, 130, 1, env=ENV)
    for rank, (ok, faulted, after_reset) in enumerate(results):
        _served(ok, f"rank {rank} step 1")
        fault = faulted["fault"]
        assert fault is not None, f"rank {rank}: no MonoFault in the step a rank was late"
        # the rank that gives up does so in the handshake; the others stop at whichever
        # K1 wait of that step they are in when its alarm lands (a loaded machine runs
        # the late rank's interpreter behind, so it may still be in its head items)
        assert "kda.handshake" in fault or ("step 2" in fault and "had raised an alarm" in fault), (
            f"rank {rank}: {fault}"
        )
        assert faulted["hidden_nan"], f"rank {rank}: the faulted step's hidden states passed"
        _served(after_reset, f"rank {rank} step 3, after reset()")
    assert "kda.handshake" in results[0][1]["fault"], results[0][1]["fault"]
    assert "rank 1 never arrived" in results[0][1]["fault"], results[0][1]["fault"]
