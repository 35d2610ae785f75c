"""The drafter kernel's contract in pure Python: build keys (narrow / wide), the item plan,
every wait naming a smaller ticket, scratch and peer layouts, the launch spec, the runner's
refusals (no kernel runs)."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch
from mono_kernels_kimi.drafter import triton_build
from mono_kernels_kimi.drafter.build import DrafterTriton, launch_spec
from mono_kernels_kimi.drafter.config import DrafterConfig
from mono_kernels_kimi.drafter.reference import cos_sin_cache
from mono_kernels_kimi.drafter.runner import refusals
from mono_kernels_kimi.drafter.spec import (
    ALIGN,
    LAYER_POINTERS,
    MAX_REQUESTS,
    NARROW,
    DrafterBuild,
    layer_stages,
    layer_starts,
    peer_bytes,
    peer_layout,
    per_layer,
    scratch_layout,
    stage_of,
    tickets,
    timeline_deps,
    waits,
)
from mono_runtime.kernel import RUNTIME_ARGS, registry

REAL = DrafterTriton.example().key.cfg


BUILDS = [DrafterBuild(DrafterConfig.tiny(tp), w) for tp in (1, 2, 4) for w in (False, True)] + [
    DrafterBuild(REAL.with_tp(tp), w) for tp, w in ((1, False), (8, True))
]


def _ids(b):
    size = "tiny" if b.cfg.hidden_size < 2048 else "real"
    return f"{size}-tp{b.tp}-{'wide' if b.wide else 'narrow'}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("b", BUILDS, ids=_ids)
def test_every_wait_names_a_smaller_ticket_and_the_plan_covers_the_shapes(b):
    """Deadlock freedom at any residency: a wait names only earlier tickets; the tiles
    cover every weight row and column exactly."""
    for t, before in waits(b).items():
        assert before and all(0 <= w < t for w in before), (t, stage_of(b, t), before)
    c, p = b.cfg, b.plan
    assert p.nqa * p.qa >= c.qkv_a_rows >= p.qa and p.nqb * p.qbn >= c.q_b_rows >= p.qbn
    assert p.no * p.oc == c.hidden_size and p.ngu * p.gb == c.local_intermediate
    assert p.nhg * p.hg == c.local_heads and p.qhr >= p.hg * c.query_len
    assert p.nla * p.la == c.kv_lora_rank and b.rows % p.rb == 0
    assert p.nlc * p.lc == c.kv_lora_rank and p.nvb * p.vb == c.v_head_dim  # comb, uv
    # a row group's items in each row stage: the whole row, or one a chunk of rc columns
    assert p.ri in (1, -(-c.hidden_size // p.rc)) and dict(layer_stages(b))["post"] == (
        b.groups * p.ri
    )
    assert tickets(b) == c.num_hidden_layers * per_layer(b) + b.groups * p.ri
    assert stage_of(b, tickets(b) - 1) == (c.num_hidden_layers, "final", b.groups * p.ri - 1)
    attn = dict(layer_stages(b))["attn"]
    assert attn == b.requests * p.nhg * p.nsplit  # the long-context split


@pytest.mark.timeout(30)
@pytest.mark.parametrize("b", BUILDS[:2], ids=_ids)
def test_timeline_deps_add_the_pushes_a_row_item_polls_for(b):
    """The critical path steps back through a row item's pushes too: post reads its
    layer's o_proj pushes, norm (past layer 0) and the final norm the layer before's down
    pushes; everything else reads only what it waits for."""
    deps, w, st, pl = timeline_deps(b), waits(b), layer_starts(b), per_layer(b)
    counts = dict(layer_stages(b))
    for t, got in deps.items():
        k, stage, _ = stage_of(b, t)
        assert set(w.get(t, [])) <= set(got) and all(d < t for d in got), (t, stage)
        pushed = set(got) - set(w.get(t, []))
        src = {"post": (k, "oproj"), "norm": (k - 1, "down"), "final": (k - 1, "down")}
        if stage in src and (stage != "norm" or k):
            kk, s2 = src[stage]
            assert pushed == set(range(kk * pl + st[s2], kk * pl + st[s2] + counts[s2])), t
        else:
            assert not pushed, (t, stage)


def _down_waits_cover_their_columns(b):
    p, c = b.plan, b.cfg
    want, first, per = waits(b), layer_starts(b), c.local_intermediate // p.dks
    for i in range(dict(layer_stages(b))["down"]):
        got = want[first["down"] + i]
        tiles = {(t - first["gu"]) // p.gks for t in got}
        parts = sorted((t - first["gu"]) % p.gks for t in got)
        assert parts == sorted(list(range(p.gks)) * len(tiles)), (i, got)
        cols = {col for tile in tiles for col in range(tile * p.gb, (tile + 1) * p.gb)}
        kp = i // p.no
        assert cols == set(range(kp * per, (kp + 1) * per)), (i, kp, sorted(tiles))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("b", BUILDS, ids=_ids)
def test_a_down_part_waits_for_every_gate_up_item_of_its_columns(b, monkeypatch):
    """Down's K parts read `mid` columns that gate_up's row tiles write, the last of a
    tile's K parts to finish: a down item must wait for every part of every tile in its
    columns (the interpreter runs tickets in order, so a short wait fails only on a GPU).
    The tiny builds split down in 2 where they can; a real one is checked in 3 parts."""
    _down_waits_cover_their_columns(b)
    if b.cfg.hidden_size >= 2048:
        from mono_kernels_kimi.drafter.spec import TILES_ENV

        monkeypatch.setenv(TILES_ENV, "dks=3")
        three = DrafterBuild(b.cfg, b.wide)
        assert three.plan.dks == 3 and dict(layer_stages(three))["down"] == 3 * three.plan.no
        _down_waits_cover_their_columns(three)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("b", BUILDS, ids=_ids)
def test_layouts_are_aligned_and_disjoint(b):
    for layout in (scratch_layout(b), peer_layout(b.cfg)):
        spans = sorted(layout.values())
        for (o1, n1), (o2, _) in zip(spans, spans[1:], strict=False):
            assert o1 % ALIGN == 0 and o1 + n1 <= o2
    assert scratch_layout(b)["done"][1] == 8 * tickets(b)
    rows = MAX_REQUESTS * b.cfg.query_len
    assert peer_layout(b.cfg)["ar1"][1] == b.tp * rows * 8 * (b.cfg.hidden_size // 2)
    assert peer_bytes(b.cfg) % ALIGN == 0


@pytest.mark.timeout(30)
def test_build_keys_narrow_wide_and_registration():
    cfg = DrafterConfig.tiny(2)
    narrow, wide = DrafterBuild(cfg, False), DrafterBuild(cfg, True)
    assert (narrow.requests, wide.requests) == (NARROW, MAX_REQUESTS)
    assert narrow.key() != wide.key() and "narrow" in narrow.key() and "wide" in wide.key()
    assert DrafterBuild(cfg.with_tp(4), False).key() != narrow.key()
    assert registry.get("drafter triton") is DrafterTriton
    spec = launch_spec(narrow)
    assert spec.names[-len(RUNTIME_ARGS) :] == tuple(a.name for a in RUNTIME_ARGS)
    kernel_args = inspect.signature(triton_build.drafter_kernel.fn).parameters
    assert tuple(kernel_args)[: len(triton_build.LAUNCH_ARGS)] == triton_build.LAUNCH_ARGS
    assert set(triton_build.kernel_types()) == set(triton_build.LAUNCH_ARGS)
    consts = triton_build.constexprs(wide, cpu=True)
    assert set(consts) == set(tuple(kernel_args)[len(triton_build.LAUNCH_ARGS) :])
    assert len(LAYER_POINTERS) == 13 and LAYER_POINTERS[-1] == "cache"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "kw",
    [
        dict(tp=3, num_attention_heads=6, intermediate_size=96),
        dict(num_hidden_layers=17),
        dict(kv_lora_rank=48),
        dict(num_speculative_tokens=17),
    ],
)
def test_builds_refuse_shapes_they_cannot_serve(kw):
    cfg = replace(DrafterConfig.tiny(1), **kw)
    with pytest.raises(ValueError):
        DrafterBuild(cfg, False)


def _caches(cfg, blocks=5, dtype=torch.bfloat16):
    return [
        torch.zeros(blocks, 1, cfg.block_size, cfg.kv_entry, dtype=dtype)
    ] * cfg.num_hidden_layers


@pytest.mark.timeout(30)
def test_refusals_name_each_reason():
    """The deployment refusals the runner raises as MonoUnsupported (on every rank)."""
    cfg = DrafterConfig.tiny(2)
    rope = cos_sin_cache(cfg)
    ok = _caches(cfg)
    tp3 = replace(cfg, tp=3, num_attention_heads=6, intermediate_size=96)
    strided = torch.zeros(5, cfg.block_size, 2 * cfg.kv_entry, dtype=torch.bfloat16)[..., ::2]
    odd = torch.zeros(5 * cfg.block_size * cfg.kv_entry + 1, dtype=torch.bfloat16)[1:]
    odd = odd.view(5, cfg.block_size, cfg.kv_entry)  # contiguous, 2 bytes past 16
    assert refusals(cfg, 2, ok, rope, None, 2) == []
    assert refusals(cfg, 2, ok, rope, 132, 132) == []
    cases = [
        ("CU count", (cfg, 2, ok, rope, 64, 132)),
        ("TP size", (cfg, 4, ok, rope, None, 2)),
        ("tp 3", (tp3, 3, ok, rope, None, 2)),
        ("layer count", (cfg, 2, ok[:1], rope, None, 2)),
        ("num_hidden_layers", (replace(cfg, num_hidden_layers=17), 2, ok * 9, rope, None, 2)),
        ("rope cache dtype", (cfg, 2, ok, rope.to(torch.bfloat16), None, 2)),
        ("rope cache shape", (cfg, 2, ok, rope[:, :4], None, 2)),
        ("positions", (cfg, 2, ok, rope[:100], None, 2)),
        ("contiguous", (cfg, 2, ok, rope.t().contiguous().t(), None, 2)),
        ("KV cache 0 shape", (cfg, 2, [c[..., :-1] for c in ok], rope, None, 2)),
        ("KV cache 0 dtype", (cfg, 2, _caches(cfg, dtype=torch.float16), rope, None, 2)),
        ("KV cache 0 dtype", (replace(cfg, cache_dtype="fp8"), 2, ok, rope, None, 2)),
        ("KV cache 1: must be contiguous", (cfg, 2, [ok[0], strided], rope, None, 2)),
        ("KV cache 1: 6 blocks", (cfg, 2, [ok[0], _caches(cfg, 6)[0]], rope, None, 2)),
        ("KV cache 1: address", (cfg, 2, [ok[0], odd], rope, None, 2)),
    ]  # fmt: skip
    for what, args in cases:
        reasons = refusals(*args)
        assert any(what in r for r in reasons), (what, reasons)
    fp8 = replace(cfg, cache_dtype="fp8")
    assert refusals(fp8, 2, _caches(fp8, dtype=torch.uint8), rope, None, 2) == []


def test_tile_overrides_are_checked(monkeypatch):
    """MONO_DRAFTER_TILES replaces a real-shape build's tiles (a benchmark's variant); one
    program an SM narrows the grid the runner may launch; tiny builds keep theirs; bad
    values are refused by name."""
    from mono_kernels_kimi.drafter.bench import rank_config
    from mono_kernels_kimi.drafter.spec import TILES_ENV

    real = rank_config()
    p = DrafterBuild(real, False).plan
    assert (p.qa, p.nsplit, p.gb, p.hk, p.occ, p.dks) == (64, 32, 32, 128, 1, 3)
    # down in 2 K parts where 3 do not divide gate_up's row tiles (64 of 32 rows)
    assert DrafterBuild(replace(real, intermediate_size=2048 * real.tp), False).plan.dks == 2
    assert (p.qks, p.nqa, p.gks, p.ngu, p.ast) == (4, 33, 4, 72, 2)
    assert (p.rc, p.ri, p.gpair) == (2048, 4, 1)  # a narrow row group: one item a chunk
    assert (p.lc, p.nlc, p.vb, p.nvb) == (128, 4, 32, 4)  # comb's latent chunks, uv's rows
    w = DrafterBuild(real, True).plan  # the wide build: whole-row items
    assert (w.gks, w.ngu, w.rc, w.ri) == (4, 72, 2048, 1)
    rope = cos_sin_cache(real)
    caches = _caches(real, blocks=2)
    assert refusals(real, 1, caches, rope, 132, 132) == []  # one program an SM by default
    assert refusals(real, 1, caches, rope, 132, 264)
    monkeypatch.setenv(
        TILES_ENV, "nsplit=8,nsplit_wide=8,qa=16,gb=16,kstep=256,occ=2,ast=3,gpair=0,cst=2"
    )
    narrow, wide = DrafterBuild(real, False).plan, DrafterBuild(real, True).plan
    assert (narrow.nsplit, wide.nsplit, narrow.qa, narrow.nqa) == (8, 8, 16, 132)
    assert (narrow.gb, narrow.ngu, narrow.hk, narrow.occ, narrow.ast) == (16, 144, 256, 2, 3)
    assert (narrow.gpair, wide.gpair, narrow.cst, wide.cst) == (0, 0, 2, 2)
    assert refusals(real, 1, caches, rope, 132, 264) == []
    assert refusals(real, 1, caches, rope, 132, 396)
    monkeypatch.setenv(TILES_ENV, "gks=7")  # K parts need not be a power of two
    seven = DrafterBuild(real, False).plan
    assert (seven.gks, seven.ngu * seven.gks, seven.hk) == (7, 504, 128)
    assert (real.hidden_size // seven.qks) % seven.hk == 0  # one K step serves both splits
    assert DrafterBuild(DrafterConfig.tiny(2), False).plan.occ == 1
    bads = (
        "qa=24",
        "gb=8",
        "kc=48",
        "nsplit=0",
        "occ=3",
        "stages=9",
        "ast=0",
        "gpair=3",
        "cst=5",
        "gks=5",
        "dks=5",
        "lc=96",
        "vb=256",
        "nope=1",
        "qa=x",
    )
    for bad in bads:
        monkeypatch.setenv(TILES_ENV, bad)
        with pytest.raises(ValueError, match="drafter tiles|MONO_DRAFTER_TILES"):
            _ = DrafterBuild(real, False).plan
