"""The instruction-fetch probe computes its chain in both forms (interpreter) and its
straight form really is straight-line code (sm_90 compile): N FMAs, no loop."""

import pytest
import torch
from mono_peer.testing import spawn
from mono_runtime import bench_icache as B


def chains_child(rank, world, group):
    out = {}
    for rolled in (False, True):
        x0, y, spans = B.run_chain(8, rolled, 2, "cpu", cpu=True, ilp=2)
        out[rolled] = (torch.allclose(y, B.reference(x0, 8), rtol=1e-6), spans.tolist())
    return out


def sass_child(rank, world, group):
    from mono_runtime.compile_check import compile_for
    from mono_runtime.sass import sass_of

    types = {"x0": "*fp32", "out": "*fp32", "spans": "*i64", "n": "i32"}
    from mono_runtime.codesize import by_function

    out = {}
    for rolled in (False, True):
        k = compile_for(B._chain, types, {"N": 32, "ILP": 2, "ROLLED": rolled, "CPU": False})
        out[rolled] = sass_of(k).count("FFMA")
        out[f"ptx{rolled}"] = dict(by_function(k.asm["ptx"], B.__file__))
    return out


@pytest.mark.timeout(120)
def test_both_forms_compute_the_chain_under_the_interpreter():
    out = spawn(chains_child, 1, 100, env={"TRITON_INTERPRET": "1"})[0]
    for rolled, (same, spans) in out.items():
        assert same, f"rolled={rolled}: the chain differs from the host's"
        assert spans == [1, 1]  # the interpreter's clock counts polls: 0 -> 1


@pytest.mark.timeout(240)
def test_the_straight_form_is_straight_line_code_and_codesize_finds_it():
    """Two lanes a thread: the straight form is the N x 2 FMAs themselves, the loop a few; and
    `codesize.by_function` puts them in `_chain`, no other function of the module."""
    got = spawn(sass_child, 1, 220, env={"TRITON_INTERPRET": "0"})[0]
    assert got[False] == 64, got
    assert got[True] <= 16, got  # (ptxas unrolls the loop's body a few times)
    straight, rolled = got["ptxFalse"], got["ptxTrue"]
    assert straight["_chain"] >= 64 > rolled["_chain"], (straight, rolled)
    assert set(straight) <= {"_chain", "?"} and set(rolled) <= {"_chain", "?"}
