"""Build keys, the compile cache, the residency check, and sm_90 compiles of the kernels
(no GPU: Triton's compiler and ptxas run on the CPU, in a child process so this process
never fixes Triton's mode for other tests)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from mono_peer.testing import spawn
from mono_runtime.builds import (
    CompileCache,
    DeviceLimits,
    Resources,
    build_hash,
    residency_problem,
)


@dataclass(frozen=True)
class Key:
    width: int
    tp: int = 2


def fake_kernel():  # a stand-in "kernel": source_hash reads its module's source
    return None


def test_build_hash_separates_key_source_target():
    a = build_hash(Key(1), fake_kernel, "cuda:90:32")
    assert a == build_hash(Key(1), fake_kernel, "cuda:90:32")
    assert a != build_hash(Key(2), fake_kernel, "cuda:90:32")
    assert a != build_hash(Key(1, tp=4), fake_kernel, "cuda:90:32")
    assert a != build_hash(Key(1), fake_kernel, "hip:gfx950:64")


def test_compile_cache_compiles_once_and_warms_every_width():
    cache, calls = CompileCache(), []
    compiled = cache.warm([Key(w) for w in (1, 2, 4)], fake_kernel, "t",
                          lambda k: calls.append(k) or f"bin{k.width}")
    assert compiled[Key(4)] == "bin4" and len(cache) == 3
    assert cache.get(Key(2), fake_kernel, "t", lambda: "other") == "bin2"
    assert len(calls) == 3


def test_residency_reasons():
    h200 = DeviceLimits()
    light = Resources(registers=56, shared=32, threads=128)
    assert residency_problem(light, 132, h200) is None
    assert residency_problem(light, 132 * 8, h200) is None  # 8 x 128 x 56 regs fits
    heavy_regs = Resources(registers=128, shared=0, threads=512)
    why = residency_problem(heavy_regs, 133, h200, "ffn")
    assert why is not None and "ffn" in why and "registers binds" in why and "= 132" in why
    heavy_smem = Resources(registers=32, shared=200_000, threads=128)
    assert "shared memory binds" in residency_problem(heavy_smem, 200, h200)
    assert "threads binds" in residency_problem(Resources(16, 0, 1024), 300, h200)


def compile_child(rank, world, group):
    from mono_runtime.allreduce import ARG_TYPES, AllreduceBuild, constexprs
    from mono_runtime.allreduce.kernel import allreduce_kernel
    from mono_runtime.compile_check import compile_for, resources_of

    out = {}
    for norm in (False, True):
        build = AllreduceBuild(16, 6144, 8, residual=norm, norm=norm)
        k = compile_for(allreduce_kernel, ARG_TYPES, constexprs(build))
        out[norm] = (k.asm["ptx"], resources_of(k))
    return out


def other_kernels_child(rank, world, group):
    """The guard and the benchmark kernels compile for sm_90 (the GPU run must not be the
    first to find a compile error)."""
    from mono_runtime import bench_protocol as B
    from mono_runtime.compile_check import compile_for
    from mono_runtime.guard import _guard_kernel

    mailbox = {"ctl": "*i64", "health": "i64", "peers": "*i64", "region": "i32"}
    compile_for(_guard_kernel, {"x": "*bf16", "n": "i32", "peers": "*i64", "rank": "i32",
                                "world": "i32"}, {"BLOCK": 1024})
    compile_for(B._ping_pong, {**mailbox, "rounds": "i32"}, {"CPU": False})
    compile_for(B._tickets, {**mailbox, "tickets": "*i64", "done": "*i64", "n_items": "i32",
                             "lag": "i32"}, {"CPU": False})
    return True


@pytest.mark.timeout(240)
def test_guard_and_bench_kernels_compile_for_sm90():
    assert spawn(other_kernels_child, 1, 220, env={"TRITON_INTERPRET": "0"}) == [True]


@pytest.mark.timeout(240)
def test_allreduce_compiles_for_sm90_with_system_scope_mailboxes():
    import re

    out = spawn(compile_child, 1, 220, env={"TRITON_INTERPRET": "0"})[0]
    for ptx, res in out.values():
        atoms = set(re.findall(r"atom\.global\.[\w.]+", ptx))
        assert "atom.global.sys.release.exch.b64" in atoms  # peer publishes
        assert "atom.global.sys.release.max.s32" in atoms  # alarm words at peers
        assert "atom.global.gpu.acq_rel.add.u64" in atoms  # ticket counter
        assert "ld.volatile.global" in ptx and "%globaltimer" in ptx
        assert residency_problem(res, 132, DeviceLimits()) is None
        # ptxas saves one 64-bit register around the ticket atomic (once per item); any
        # real spilling of the row blocks would show as far more
        assert res.spill_bytes <= 16, res
