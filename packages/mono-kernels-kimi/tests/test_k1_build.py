"""K1 on mono_runtime's Build interface, on a CPU: registered, its launch spec is
spec.ARGS with types, and compile_for / launch / warm go through triton_build (replaced
by recorders here: test_k1_compile.py and the qualify test compile for real)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from mono_kernels_kimi.config import KimiK3Config
from mono_kernels_kimi.kda import spec, triton_build
from mono_kernels_kimi.kda.build import K1Triton
from mono_kernels_kimi.kda.spec import K1Build
from mono_runtime.kernel import Compiled, registry

BUILD = K1Build.for_step(KimiK3Config.tiny(), 1, 1, programs=3)


def test_registered_with_the_real_model_as_example():
    assert registry.get("kda triton") is K1Triton
    example = K1Triton.example().key
    assert example.rows == 8 and example.write_block and example.hidden == 7168


def test_the_spec_is_the_kernels_argument_list():
    assert K1Triton.spec.names == triton_build.LAUNCH_ARGS
    assert K1Triton.spec.names[: len(spec.ARGS)] == spec.ARGS
    types = {**triton_build.kernel_types(), **triton_build.RUNTIME_TYPES}
    assert all(a.type == types[a.name] for a in K1Triton.spec.args if a.name != "o_norm")
    assert K1Triton.spec.by_name["o_norm"].type == "*"  # bf16 or fp32 (checks.py)


DTYPES = {
    "*bf16": torch.bfloat16,
    "*fp32": torch.float32,
    "*i32": torch.int32,
    "*i64": torch.int64,
    "*u8": torch.uint8,
}


def _args():
    """Placeholder values of the spec's types: what a launch's checks look at."""
    scalars = {"fp32": 1e-6, "i32": 1, "i64": 0, "i1": False}
    return {
        a.name: scalars[a.type]
        if a.type in scalars
        else torch.zeros(1, dtype=DTYPES.get(a.type, torch.bfloat16))
        for a in K1Triton.spec.args
    }


def test_launch_and_compile_go_through_triton_build(monkeypatch):
    seen = []
    monkeypatch.setattr(triton_build, "launch", lambda b, args: seen.append((b, args)))
    kernel = SimpleNamespace(metadata=SimpleNamespace(shared=2048))
    monkeypatch.setattr(triton_build, "compile_for", lambda b, t: seen.append((b, t)) or kernel)
    k1, args = K1Triton(BUILD), _args()
    k1.warm(3, **args)  # a CPU: nothing to compile
    k1.launch(3, **args)
    assert K1Triton.example().compile_for("sm90") == Compiled("sm90", 2048)
    assert seen[0] == (BUILD, args) and seen[1][1] == "sm90"
    with pytest.raises(ValueError, match="programs=4: this build was made for 3"):
        k1.launch(4, **args)
    with pytest.raises(ValueError, match="k1: argument 'num_blocks': expected an int"):
        k1.launch(3, **{**args, "num_blocks": 1.0})
    assert len(seen) == 2


def test_tile_overrides_are_checked(monkeypatch):
    """MONO_K1_TILES replaces a real-shape build's tiles (a benchmark's variant); tiny
    builds keep theirs; explicit tiling wins; bad values are refused by name."""
    real, tiny = KimiK3Config(), KimiK3Config.tiny(1)
    assert K1Build.for_step(real, 16, 1).stage_items[2:] == (200, 16 * 12)
    monkeypatch.setenv(spec.TILES_ENV, "block_v=32,split_k=8,stages=3")
    b = K1Build.for_step(real, 16, 1)
    assert (b.block_v, b.split_k, b.stages, b.num_warps) == (32, 8, 3, 8)
    assert b.stage_items[2:] == (400, 16 * 12 * 5)
    assert K1Build.for_step(real, 16, 1, block_v=64).block_v == 64
    assert K1Build.for_step(tiny, 1, 1) == K1Build.for_step(tiny, 1, 1, **spec.fit_tiling(tiny))
    for bad in ("block_v=96", "split_k=3", "nope=1", "block_n=x"):
        monkeypatch.setenv(spec.TILES_ENV, bad)
        with pytest.raises(ValueError, match="MONO_K1_TILES|power of two|multiple"):
            K1Build.for_step(real, 1, 1)


def test_proj_prefetch_is_checked_and_nvidia_only(monkeypatch):
    """`proj_pf` (an override for GPU tuning) is a multiple of 8 columns within a proj
    item's K part; gfx950 refuses a build that sets it (the prefetch is NVIDIA PTX)."""
    real = KimiK3Config()
    assert K1Build.for_step(real, 1, 1).proj_pf == 0
    monkeypatch.setenv(spec.TILES_ENV, "proj_pf=512")
    b = K1Build.for_step(real, 1, 1)
    assert b.proj_pf == 512 and triton_build.constexprs(b, triton_build.offsets(b))["PF"] == 512
    assert "NVIDIA" in K1Triton(b).supports("gfx950") and K1Triton(b).supports("sm90") is None
    for bad in ("proj_pf=12", f"proj_pf={real.hidden_size}"):
        monkeypatch.setenv(spec.TILES_ENV, bad)
        with pytest.raises(ValueError, match="proj_pf"):
            K1Build.for_step(real, 1, 1)


def test_ares_items_fill_the_programs_once_and_proj_parts_by_width():
    """`ares_block_h`: 256 columns an AttnRes item (28 a row) while a stage's items fit 132
    programs, 512 at 8 rows (112 items), 1024 at 16 (112), never more; an explicit
    block_h stays."""
    real = KimiK3Config()
    got = {r: K1Build.for_step(real, r, 1, programs=132).block_h for r in (1, 2, 4, 8, 16)}
    assert got == {1: 256, 2: 256, 4: 256, 8: 512, 16: 1024}
    assert K1Build.for_step(real, 2, 8, programs=132).block_h == 1024  # rows = R x L
    assert K1Build.for_step(real, 16, 1, block_h=256).block_h == 256
    assert K1Build.for_step(real, 16, 1, programs=8).block_h == 1024  # the cap
    parts = {r: K1Build.for_step(real, r, 1).split_k for r in (1, 2, 4, 8, 9, 16)}
    assert parts == {1: 2, 2: 2, 4: 4, 8: 2, 9: 4, 16: 4}  # spec.proj_split_k


def test_head_items_fill_the_programs_once_then_hold_whole_heads():
    """`head_block_v`: 16 state rows an item at one request (96 items + 12 norms on 132
    programs), twice as many rows per doubling of the requests, whole heads (each item its
    own norm) from 8; the timeline's stages follow."""
    real = KimiK3Config()
    got = {r: K1Build.for_step(real, r, 1, programs=132) for r in (1, 2, 4, 8, 16)}
    assert {r: b.block_v for r, b in got.items()} == {1: 16, 2: 32, 4: 64, 8: 128, 16: 128}
    assert {r: b.stage_items[3] for r, b in got.items()} == {
        1: 12 * 9, 2: 24 * 5, 4: 48 * 3, 8: 96, 16: 192
    }  # fmt: skip
    one, whole = got[1], got[8]
    e3 = sum(one.stage_items[:3])
    assert [one.stage_of(e3 + i) for i in (0, 7, 8, 9)] == ["head", "head", "norm", "head"]
    e3 = sum(whole.stage_items[:3])
    assert {whole.stage_of(e3 + i) for i in range(96)} == {"head"}
    assert whole.stage_of(e3 + 96) == "handshake"
