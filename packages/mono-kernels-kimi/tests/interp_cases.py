"""Child process of test_k1_interpret.py: runs K1 under TRITON_INTERPRET=1 on every case
and prints one JSON object of measurements per case (the parent asserts on them).

Kept out of the pytest process so that the interpreter switch can never leak into GPU
tests collected in the same session.
"""

from __future__ import annotations

import json
import os
import sys
import zlib

import torch
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.kda.inputs import make_inputs

TILING = dict(programs=3, block_h=32, block_n=16, block_k=32, split_k=2, block_v=8)


# The (R, L) spec-verify shapes run by default: every R at L = 1 would cost 25 interpreter
# launches, most of them repeating what a neighbour checks; these cover one request and
# several, each L from 1 to 4 and the longest, padding and both conv layouts.
# MONO_K1_ALL_CASES=1 runs every R x L <= 8.
DEFAULT_SPEC = {(1, 1), (2, 1), (5, 1), (8, 1), (2, 2), (4, 2), (1, 3), (2, 3), (1, 4), (2, 4)}
DEFAULT_SPEC.add((1, 8))
DEFAULT_DECODE = (1, 3, 16)


def cases():
    """(name, R, L, spec, layer_idx, pad, pad_slot, conv_layout, block_v): every (R, L)
    with R x L <= 8 as spec-verify, plus plain decodes, and two steps of 16 rows (the most
    a build serves; each costs interpreter time): spec 2 x 8 and a plain decode of 16.
    Layers cycle through the first layer (no delta), block-write layers and ordinary
    ones; padding, conv layouts and head items (half a head's state rows, with norm items
    apart, or the whole head) vary. Without MONO_K1_ALL_CASES=1, the subset above."""
    every = os.environ.get("MONO_K1_ALL_CASES", "") not in ("", "0")
    out = []
    n = 0
    for L in range(1, 9):
        for R in range(1, 8 // L + 1):
            layer = (0, 1, 2, 3, 4)[n % 5]
            pad = (R - 1,) if R > 1 else ()
            if every or (R, L) in DEFAULT_SPEC:
                case = (f"spec-R{R}-L{L}", R, L, True, layer, pad, (-1, 0)[n % 2])
                out.append((*case, ("SD", "DS")[n % 2], (8, 16)[n % 3 == 1]))
            n += 1
    out.append(("spec-R2-L8", 2, 8, True, 2, (1,), -1, "DS", 16))  # 16 rows, the longest L
    for R in (1, 3, 8, 16):
        if every or R in DEFAULT_DECODE:
            pad = (0,) if R > 1 else ()
            out.append((f"decode-R{R}", R, 1, False, 3, pad, -1, "SD", (8, 16)[R == 16]))
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_case(name, R, L, spec, layer, pad, pad_slot, layout, block_v):
    cfg = KimiK3Config.tiny()
    inp = make_inputs(
        cfg,
        R,
        L,
        spec=spec,
        layer_idx=layer,
        delta=layer > 0,
        pad=pad,
        pad_slot=pad_slot,
        conv_layout=layout,
        seed=zlib.crc32(name.encode()) % 1000,
    )
    init = inp.clone()
    ref = inp.clone()
    want = ref.reference()
    from mono_kernels_kimi.kda.runner import KdaRunner

    runner = KdaRunner(cfg, "cpu", L, spec=spec, **{**TILING, "block_v": block_v})
    runner(R, **inp.k1_kwargs())
    idx = inp.state_indices.view(R, -1).long()
    valid = [r for r in range(R) if r not in pad]
    owned = {int(idx[r, t]) for r in valid for t in range(idx.shape[1])}
    written = all(
        rel(inp.state[int(idx[r, t])], ref.state[int(idx[r, t])]) < 1e-3
        and not torch.equal(inp.state[int(idx[r, t])], init.state[int(idx[r, t])])
        for r in valid
        for t in range(L)
    )
    untouched = all(
        torch.equal(inp.state[s], init.state[s])
        and torch.equal(inp.conv_state[s], init.conv_state[s])
        for s in range(inp.state.shape[0])
        if s not in owned
    )
    pad_rows = [r * L + t for r in pad for t in range(L)]
    return dict(
        core=rel(inp.out, want),
        state=rel(inp.state, ref.state),
        conv=rel(inp.conv_state, ref.conv_state),
        prefix=torch.equal(inp.prefix, ref.prefix),
        blocks=torch.equal(inp.blocks, ref.blocks),
        written=written,
        untouched=untouched,
        pad_zero=bool(torch.all(inp.out[pad_rows] == 0)) if pad_rows else True,
        finite=bool(torch.isfinite(inp.out.float()).all()),
        tickets=int(runner.mono.tickets.abs().sum()),
        giveups=int(runner.mono.health[0]),
    )


def give_up_case():
    """A launch whose first item never runs (a program took its ticket and died): the waits
    for it give up at the runner's deadline, the launch still ends (its ticket counter
    reset), check() raises MonoFault naming what was waited for, the output is NaN and no
    state was written; after reset() the runner serves a step correctly."""
    from mono_kernels_kimi.kda.runner import KdaRunner
    from mono_runtime.errors import MonoFault
    from mono_runtime.runner import CPU_NS_PER_POLL

    cfg = KimiK3Config.tiny()
    runner = KdaRunner(cfg, "cpu", 2, deadline_ns=50 * CPU_NS_PER_POLL, **TILING)
    inp = make_inputs(cfg, 1, 2, layer_idx=3, seed=5)
    got = inp.clone()
    runner.mono.tickets[0] = 1  # ticket 0 of slot 0 drawn by a program that died
    runner(1, **got.k1_kwargs())
    try:
        runner.check()
        raised = ""
    except MonoFault as fault:
        raised = str(fault)
    tickets = int(runner.mono.tickets.abs().sum())
    runner.reset()
    ok = inp.clone()
    ref = inp.clone()
    want = ref.reference()
    runner(1, **ok.k1_kwargs())
    return dict(
        raised=raised,
        tickets_after=tickets,
        out_nan=bool(torch.isnan(got.out.float()).all()),
        state_kept=torch.equal(got.state, inp.state)
        and torch.equal(got.conv_state, inp.conv_state),
        core_after_reset=rel(ok.out, want),
        giveups_after_reset=int(runner.mono.health[0]),
    )


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run me with TRITON_INTERPRET=1"
    only = set(sys.argv[1:])
    results = {}
    for case in cases():
        if not only or case[0] in only:
            results[case[0]] = run_case(*case)
    if not only or "warm" in only:
        from mono_kernels_kimi.kda.runner import KdaRunner

        runner = KdaRunner(KimiK3Config.tiny(), "cpu", 8, max_rows=8, **TILING)
        warmed = runner.warm()
        results["warm"] = dict(
            builds=sorted([b.requests, b.delta, b.write_block] for b in warmed),
            flags=[list(f) for f in runner.layer_flags()],
            tickets=int(runner.mono.tickets.abs().sum()),
            giveups=int(runner.mono.health[0]),
        )
    if not only or "giveup" in only:
        results["giveup"] = give_up_case()
    print(json.dumps(results))
