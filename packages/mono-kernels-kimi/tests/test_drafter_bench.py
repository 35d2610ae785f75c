"""The drafter's benchmark, the parts a CPU can check: the rank config's sizes, the bytes a
launch moves, the device-built step's block tables and slots, the op-by-op path's math
against the reference (with torch.compile off), argument checks before any device work,
and the printed table."""

from __future__ import annotations

import pytest
import torch
from mono_kernels_kimi.drafter import bench
from mono_kernels_kimi.drafter.config import DrafterConfig
from mono_kernels_kimi.drafter.inputs import step_inputs
from mono_kernels_kimi.drafter.reference import cache_slots, drafter_reference
from mono_kernels_kimi.drafter.weights import random_weights

pytestmark = pytest.mark.timeout(60)

TINY = DrafterConfig.tiny()


def test_rank_config_is_a_tp8_rank_at_tp1():
    cfg = bench.rank_config()
    assert cfg.tp == 1 and cfg.num_hidden_layers == 5 and cfg.hidden_size == 7168
    assert (cfg.local_heads, cfg.local_intermediate, cfg.o_proj_in) == (8, 2304, 1024)
    assert (cfg.qkv_a_rows, cfg.kv_entry, cfg.query_len) == (2112, 576, 7)


def test_bytes_read_counts_weights_kv_and_writes():
    w = random_weights(TINY)
    nl, e, q = TINY.num_hidden_layers, TINY.kv_entry_bytes, TINY.query_len
    one = bench.bytes_read(TINY, w, 1, 100)
    # 16 more context tokens (one more block-table entry): every layer reads 16 more entries
    assert bench.bytes_read(TINY, w, 1, 116) - one == nl * e * 16 + 4
    # a second request: its keys read, its block written, its rows in and out, its metadata
    per_request = nl * e * (100 + 2 * q) + 4 * q * TINY.hidden_size
    per_request += q * (16 + 4 * TINY.qk_rope_head_dim) + 4 * bench.blocks_of(TINY, 100) + 4
    assert bench.bytes_read(TINY, w, 2, 100) - one == per_request
    weights = sum(t.numel() * t.element_size() for lw in w.layers for t in lw.tensors().values())
    assert one - per_request == weights + 2 * TINY.hidden_size  # + the final norm


def test_device_step_owns_distinct_blocks_and_its_block_slots():
    caches = bench.random_caches(TINY, 1 + 3 * bench.blocks_of(TINY, 40), 0, "cpu")
    step = bench.step_on_device(TINY, 3, 40, caches, 1, "cpu")
    used = step.block_table.flatten()
    assert used.unique().numel() == used.numel() and int(used.min()) >= 1
    q = TINY.query_len
    for i in range(3):
        want = cache_slots(step.block_table, i, 40 + q, TINY.block_size)[40:]
        assert torch.equal(step.slot_mapping[i * q : (i + 1) * q], want)
    assert step.seq_lens.tolist() == [40 + q] * 3
    with pytest.raises(ValueError, match="the caches hold"):
        bench.step_on_device(TINY, 4, 40, caches, 1, "cpu")


@pytest.mark.parametrize("cache_dtype", ["auto", "fp8"])
def test_op_by_op_is_the_reference(cache_dtype, monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)
    cfg = DrafterConfig.tiny(cache_dtype=cache_dtype)
    w = random_weights(cfg, seed=3)
    step = step_inputs(cfg, w, 3, seed=4)  # context lengths differ: the key mask matters
    want = drafter_reference(
        cfg,
        step.embeds,
        step.positions,
        step.caches,
        step.block_table,
        step.seq_lens,
        step.slot_mapping,
        [w],
        exact=False,
    )
    base = bench.OpByOp(cfg, w)
    got = base(step, base.keys(step))  # writes step.caches in place
    for mine, theirs in zip(step.caches, want.caches, strict=True):
        assert torch.equal(mine, theirs)
    err = ((got.float() - want.hidden.float()).norm() / want.hidden.float().norm()).item()
    assert err < 2e-2, err


@pytest.mark.parametrize(
    ("requests", "contexts", "says"),
    [
        ((0, 1), (1024,), r"requests \(0, 1\): each must be 1\.\.8"),
        ((9,), (1024,), r"each must be 1\.\.8"),
        ((2, 2), (1024,), "appears twice"),
        ((True,), (1024,), "expected integers"),
        ((1,), (0,), r"context \(0,\): each must be 1\.\.131072"),
        ((1,), (), "expected integers"),
    ],
)
def test_bad_arguments_are_refused(requests, contexts, says):
    with pytest.raises(ValueError, match=says):
        bench.check(requests, contexts)


def test_cli_refuses_before_any_device_work(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--requests", "1,x"])
    assert "--requests '1,x': not a comma-separated list" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--requests", "1,9"])
    assert "each must be 1..8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--context", "1024,999999"])
    assert "each must be 1..131072" in capsys.readouterr().err


def test_table_lists_every_row_and_the_notes():
    row = dict(rows=4, requests=4, context=8192, layers=5, kernel_us=312.5, bytes=8.1e8,
               copy_tbps=4.1, limit_pct=63.2, l2_x=16.2, opbyop_us=None, speedup=None,
               note="op-by-op path failed: boom")  # fmt: skip
    text = bench.table([row, {**row, "context": 1024, "opbyop_us": 900.0, "speedup": 2.88,
                              "note": None}])  # fmt: skip
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["requests", "context"]
    assert lines[1].split() == ["4", "8192", "312.5", "8.1e+08", "63.2", "16.2", "-", "-"]
    assert lines[2].split()[-2:] == ["900.0", "2.88"]
    assert "4.10 TB/s; 5 layers" in text and "R=4 context=8192: op-by-op path failed: boom" in text
