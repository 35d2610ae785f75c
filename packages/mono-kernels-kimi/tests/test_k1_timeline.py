"""K1's timeline builds: the scratch region and stage of every ticket (pure Python), and,
under the interpreter, a launch that stamps every ticket once in its stage with the same
results as a plain build, and the benchmark's `--timeline` table and pictures.

The kernels run in one child process (this file, run as a script: TRITON_INTERPRET=1 must
never leak into this one, where GPU tests may be collected); the tests assert on what it
measured.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.kda import triton_build
from mono_kernels_kimi.kda.spec import K1Build
from mono_peer.testing import child_json
from mono_runtime.timeline import stamp_bytes

TILING = dict(programs=3, block_h=32, block_n=16, block_k=32, split_k=2, block_v=8)
# (R, L, final) of the launches the child stamps: both shapes, both ends of a step, in two
# launches (each is two interpreter runs: a timeline runner and a plain one)
LAUNCHES = ((2, 2, False), (3, 1, True))


def expected_stages(b: K1Build, final: bool) -> list[str]:
    """Stage by ticket, written out from the plan: each (head, request) group of stage 4
    is its state items, then its norm item."""
    n1, n2, n3, n4 = b.stage_items
    nvc = b.head_dim // b.block_v
    head = (["head"] * nvc + ["norm"]) * (n4 // (nvc + 1))
    return ["ares"] * n1 + ["mix"] * n2 + ["proj"] * n3 + head + ["handshake"] * final


def test_timeline_builds_stamp_every_ticket():
    cfg = KimiK3Config.tiny()
    b = K1Build.for_step(cfg, 3, 2, timeline=True, **TILING)
    plain = K1Build.for_step(cfg, 3, 2, **TILING)
    assert b.scratch_layout()["timeline"][1] == stamp_bytes(b.tickets(True))
    assert "timeline" not in plain.scratch_layout()
    # the flag is in the key and adds only the region: every other offset is the same
    assert b.key() != plain.key()
    assert {k: v for k, v in b.scratch_layout().items() if k != "timeline"} == (
        plain.scratch_layout()
    )
    for final in (False, True):
        assert [b.stage_of(t) for t in range(b.tickets(final))] == expected_stages(b, final)
    with pytest.raises(ValueError, match="tickets 0"):
        b.stage_of(b.tickets(True))
    consts = triton_build.constexprs(b, triton_build.offsets(b))
    assert consts["TL"] and consts["OFF_TL"] == b.scratch_layout()["timeline"][0]
    assert consts["OFF_DONE"] == b.scratch_bytes  # the done pairs stay past the layout
    off = triton_build.constexprs(plain, triton_build.offsets(plain))
    assert not off["TL"] and off["OFF_TL"] == 0


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("timeline")
    got, _ = child_json([__file__, str(out)], 170, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    return got, out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("R,L,final", LAUNCHES)
def test_a_launch_stamps_every_ticket_once_in_its_stage(measured, R, L, final):
    m = measured[0][f"{R}x{L}-{final}"]
    b = K1Build.for_step(KimiK3Config.tiny(), R, L, timeline=True, **TILING)
    rows = m["rows"]
    assert [r["ticket"] for r in rows] == list(range(b.tickets(final)))  # none left at -1
    assert [r["stage"] for r in rows] == expected_stages(b, final)
    assert all(r["program"] in range(TILING["programs"]) for r in rows)
    assert all(r["end_us"] >= r["ready_us"] >= r["start_us"] >= 0 for r in rows)
    assert m["same_as_plain"], m  # stamping changes no result
    assert m["tickets"] == 0 and m["giveups"] == 0, m


@pytest.mark.timeout(180)
def test_plain_runners_have_no_timeline(measured):
    assert "KdaRunner(timeline=True)" in measured[0]["plain_refused"]


@pytest.mark.timeout(180)
def test_bench_prints_and_pictures_each_shape(measured):
    m, out = measured
    assert m["bench_shapes"] == ["2x1"]
    assert "proj" in m["bench_printed"] and "span" in m["bench_printed"]
    if m["pictures"]:
        assert (out / "timeline-k1-2x1.png").stat().st_size > 0


def _launch(R: int, L: int, final: bool) -> dict:
    """A timeline runner's and a plain runner's launch on the same step: the stamps (the
    region filled with -1 first, so a ticket never stamped shows) and whether the
    results match bit for bit."""
    import torch
    from mono_kernels_kimi.kda.inputs import make_inputs
    from mono_kernels_kimi.kda.runner import KdaRunner

    cfg = KimiK3Config.tiny()
    inp = make_inputs(cfg, R, L, layer_idx=3, pad=(R - 1,), seed=R * 10 + L)
    got, want = inp.clone(), inp.clone()
    KdaRunner(cfg, "cpu", L, **TILING)(R, final=final, **want.k1_kwargs())
    runner = KdaRunner(cfg, "cpu", L, timeline=True, **TILING)
    off, n = runner.build(R, True, inp.write_idx >= 0).scratch_layout()["timeline"]
    runner.scratch[off : off + n].view(torch.int64).fill_(-1)
    runner(R, final=final, **got.k1_kwargs())
    runner.check()
    same = all(
        torch.equal(getattr(got, name), getattr(want, name))
        for name in ("out", "prefix", "blocks", "state", "conv_cache")
    )
    return dict(
        rows=runner.timeline(),
        same_as_plain=same,
        tickets=int(runner.mono.tickets.abs().sum()),
        giveups=int(runner.mono.health[0]),
    )


def _child(out: str) -> dict:
    import contextlib
    import importlib.util
    import io

    from mono_kernels_kimi.kda import bench
    from mono_kernels_kimi.kda.runner import KdaRunner

    results = {f"{R}x{L}-{f}": _launch(R, L, f) for R, L, f in LAUNCHES}
    try:
        KdaRunner(KimiK3Config.tiny(), "cpu", 1, **TILING).timeline()
        results["plain_refused"] = ""
    except ValueError as err:
        results["plain_refused"] = str(err)
    # pictures need matplotlib (mono-tools' dependency, not this package's): without it
    # the table alone is checked
    results["pictures"] = importlib.util.find_spec("matplotlib") is not None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        got = bench.timelines(
            [(2, 1)],
            1,
            layer_idx=3,
            out=out if results["pictures"] else None,
            cfg=KimiK3Config.tiny(),
            device="cpu",
            **TILING,
        )
    results["bench_shapes"] = [f"{R}x{L}" for R, L in got]
    results["bench_printed"] = printed.getvalue()
    return results


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run me with TRITON_INTERPRET=1"
    print(json.dumps(_child(sys.argv[1])))
