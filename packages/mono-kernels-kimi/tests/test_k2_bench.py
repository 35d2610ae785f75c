"""K2's benchmark, the parts a CPU can check: the rank config's sizes, random stored-format
layers, the bytes a launch reads, the op-by-op path's math against the reference (with
torch.compile off), argument checks before any device work, and the printed table."""

from __future__ import annotations

import pytest
import torch
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.k2 import bench
from mono_kernels_kimi.k2.inputs import step_inputs
from mono_kernels_kimi.k2.reference import k2_reference

pytestmark = pytest.mark.timeout(120)


def test_rank_config_is_a_tp8_rank_at_tp1():
    cfg = bench.rank_config()
    assert cfg.tp == 1 and cfg.o_proj_in == 1536
    assert (cfg.routed_intermediate, cfg.shared_intermediate) == (384, 768)
    assert (cfg.num_experts, cfg.latent_size) == (896, 3584)


def test_bytes_read_counts_the_chosen_experts_once():
    cfg = KimiK3Config.tiny(1)
    w = bench.random_layer(cfg, 0, "cpu")
    one = bench.bytes_read(cfg, w, torch.tensor([[3, 3, 5, -1]]), 1, 5)
    two = bench.bytes_read(cfg, w, torch.tensor([[3, 5, 7, -1]]), 1, 5)
    assert two - one == sum(t[0].numel() for t in (w.w13, w.w13_scale, w.w2, w.w2_scale))


@pytest.mark.parametrize("layer_idx", [4, 5])  # a block-write layer and a plain one
def test_op_by_op_is_the_reference(layer_idx, monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)
    cfg = KimiK3Config.tiny(1)
    ws = [bench.random_layer(cfg, n, "cpu") for n in range(2)]
    step = step_inputs(cfg, 3, seed=4)
    base = bench.OpByOp(cfg, ws, layer_idx)
    for n, w in enumerate(ws):
        want = k2_reference(cfg, step.cores, step.prefix, step.blocks, [w], layer_idx)
        prefix = step.prefix.clone()
        got = base(step.cores[0], prefix, step.blocks.clone(), n)
        assert torch.equal(prefix, want.prefix)
        err = ((got.float() - want.out.float()).norm() / want.out.float().norm()).item()
        assert err < 2e-2, err


@pytest.mark.parametrize(
    ("rows", "layers", "says"),
    [
        ((0, 1), 4, r"each must be 1\.\.16"),
        ((1, 17), 4, r"each must be 1\.\.16"),
        ((2, 2), 4, "appears twice"),
        ((True,), 4, "expected integers"),
        ((1,), 0, r"layers 0: must be 1\.\.32"),
    ],
)
def test_bad_arguments_are_refused(rows, layers, says):
    with pytest.raises(ValueError, match=says):
        bench.check(rows, layers)


def test_cli_refuses_before_any_device_work(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--rows", "1,x"])
    assert "not a comma-separated list" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--rows", "1,99"])
    assert "each must be 1..16" in capsys.readouterr().err


def test_table_lists_every_row_and_the_notes():
    row = dict(rows=4, layers=8, kernel_us=31.25, bytes=61_000_000, copy_tbps=4.1,
               limit_pct=47.3, l2_x=12.5, opbyop_us=None, speedup=None, experts_read=40.0,
               note="op-by-op path failed: boom")  # fmt: skip
    text = bench.table([row, {**row, "rows": 16, "opbyop_us": 90.0, "speedup": 2.88, "note": None}])
    lines = text.splitlines()
    assert lines[1].split() == ["4", "31.2", "6.1e+07", "47.3", "12.5", "-", "-", "40.0"]
    assert lines[2].split()[-3:] == ["90.0", "2.88", "40.0"]
    assert "4.10 TB/s; 8 layers" in text and "S=4: op-by-op path failed: boom" in text
