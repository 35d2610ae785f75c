"""The FFN benchmark's CPU-checkable parts: per-layer random weights in every format (shapes
the kernel accepts, magnitudes of a k**-0.5 init, distinct layers), the bytes a launch
reads, argument checks before any device work, and the printed table."""

from __future__ import annotations

import pytest
import torch
from mono_kernels_minimax.config import MiniMaxM3Config
from mono_kernels_minimax.ffn.bench import _bf16, _check, bytes_read, main, random_layer, table
from mono_kernels_minimax.formats import WeightFormat


@pytest.mark.parametrize("fmt", list(WeightFormat))
def test_random_layer_shapes_and_magnitudes(fmt):
    cfg = MiniMaxM3Config.tiny()
    w = random_layer(cfg, fmt, 0, "cpu")  # validates against the kernel's expected shapes
    for name in ("w13", "w2", "shared_w13", "shared_w2"):
        dense = _bf16(w, name).float()
        std = dense.shape[-1] ** -0.5
        assert torch.isfinite(dense).all(), name
        assert 0.5 * std < dense.std().item() < 2 * std, (name, dense.std().item(), std)
    other = random_layer(cfg, fmt, 1, "cpu")
    assert not torch.equal(w.router, other.router) and not torch.equal(w.w13, other.w13)


def test_bytes_read_counts_the_chosen_experts_once():
    cfg = MiniMaxM3Config.tiny()
    w = random_layer(cfg, WeightFormat.MXFP4, 0, "cpu")
    one = bytes_read(cfg, w, torch.tensor([[3, 3, 5, -1]]), 1)
    two = bytes_read(cfg, w, torch.tensor([[3, 5, 7, -1]]), 1)
    expert = sum(t[0].numel() for t in (w.w13, w.w13_scale, w.w2, w.w2_scale))
    assert two - one == expert


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (((0, 1), ("mxfp4",), 4), r"each must be 1\.\.16"),
        (((1, 17), ("mxfp4",), 4), r"each must be 1\.\.16"),
        (((2, 2), ("mxfp4",), 4), "appears twice"),
        (((1,), ("int3",), 4), "each must be one of"),
        (((1,), ("mxfp4",), 0), r"layers 0: must be 1\.\.64"),
    ],
)
def test_bad_arguments_are_refused(args, says):
    with pytest.raises(ValueError, match=says):
        _check(*args)


def test_cli_refuses_before_any_device_work(capsys):
    with pytest.raises(SystemExit):
        main(["--rows", "1,x"])
    assert "not a comma-separated list" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--formats", "mxfp4,int3"])
    assert "each must be one of" in capsys.readouterr().err


def test_table_lists_every_row_and_the_notes():
    row = dict(
        format="mxfp4",
        rows=4,
        layers=12,
        kernel_us=31.25,
        bytes=61_000_000,
        copy_tbps=4.1,
        limit_pct=47.3,
        l2_x=12.5,
        opbyop_us=None,
        speedup=None,
        experts_read=15.0,
        note="op-by-op path failed: boom",
    )
    text = table([row, {**row, "rows": 16, "opbyop_us": 90.0, "speedup": 2.5, "note": None}])
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["format", "rows", "kernel_us"]
    assert lines[1].split() == ["mxfp4", "4", "31.2", "6.1e+07", "47.3", "12.5", "-", "-", "15.0"]
    assert lines[2].split()[-3:] == ["90.0", "2.50", "15.0"]
    assert "4.10 TB/s; 12 layers" in text and "mxfp4 S=4: op-by-op path failed: boom" in text
