"""The K1 benchmark's CPU-checkable parts: distinct per-layer weights and caches, argument
checks before any device work, and the printed table."""

from __future__ import annotations

import pytest
import torch
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.kda.bench import check_shapes, layer_weights, main, per_layer, table
from mono_kernels_kimi.kda.inputs import make_inputs


def test_every_layer_reads_its_own_weights_and_caches():
    cfg = KimiK3Config.tiny()
    ws = layer_weights(cfg, 3, "cpu")
    assert not torch.equal(ws[0]["in_proj"], ws[1]["in_proj"])
    assert (ws[2]["in_proj"][cfg.in_proj_rows_unpadded :] == 0).all()
    assert ws[0]["f_b"].data_ptr() != ws[1]["f_b"].data_ptr()
    each = per_layer(make_inputs(cfg, 2, 1, weights=ws[0]), ws)
    assert [x.weights is w for x, w in zip(each, ws, strict=True)] == [True] * 3
    assert each[0].state.data_ptr() != each[1].state.data_ptr()
    assert torch.equal(each[0].state, each[2].state)  # same step, its own copy


@pytest.mark.parametrize(
    ("shapes", "layers", "says"),
    [
        ([], 8, "none given"),
        ([(3, 6)], 8, "3x6: K1 serves at most 16 rows"),
        ([(0, 1)], 8, r"expected \(requests, L\)"),
        ([(1, 1)], 0, r"layers 0: must be 1\.\.64"),
    ],
)
def test_bad_shapes_are_refused(shapes, layers, says):
    with pytest.raises(ValueError, match=says):
        check_shapes(shapes, layers)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--shapes", "1x"], "expected RxL pairs"),
        (["--shapes", "4x5"], "K1 serves at most 16 rows"),
        (["--iters", "0"], "--iters 0: must be >= 1"),
    ],
)
def test_cli_refuses_before_any_device_work(capsys, argv, says):
    with pytest.raises(SystemExit):
        main(argv)
    assert says in capsys.readouterr().err


def test_table():
    row = dict(
        R=8,
        L=1,
        S=8,
        layers=8,
        k1_us=40.0,
        bytes=95_000_000,
        copy_GBps=4100.0,
        floor_us=23.2,
        pct_of_floor=58.0,
        l2_x=12.7,
    )
    text = table([{**row, "op_by_op_error": "boom"}, {**row, "op_by_op_us": 120.0, "speedup": 3.0}])
    lines = text.splitlines()
    assert lines[1].split() == ["8", "1", "40.0", "9.5e+07", "23.2", "58.0", "12.7", "-", "-"]
    assert lines[2].split()[-2:] == ["120.0", "3.00"]
    assert "4100.0 GB/s; 8 layers" in text and "8x1: op-by-op failed: boom" in text
