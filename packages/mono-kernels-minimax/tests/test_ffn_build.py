"""The FFN's builds on mono_runtime's Build interface, on a CPU: registered, one launch
spec for both (the backends' kernel_args keywords), what each serves and refuses, compile
results in the shared terms (the backends' compiles replaced by recorders: the qualify
test compiles for real), and FfnRunner as a LayerRunner."""

from __future__ import annotations

import inspect
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from mono_kernels_minimax.config import MiniMaxM3Config
from mono_kernels_minimax.ffn import build as ffn_build
from mono_kernels_minimax.ffn import flydsl_build, triton_build
from mono_kernels_minimax.ffn.build import FfnFlyDsl, FfnGluon, FfnTriton, launch_spec
from mono_kernels_minimax.ffn.runner import FfnRunner
from mono_kernels_minimax.ffn.spec import Experts, FfnBuild
from mono_kernels_minimax.formats import WeightFormat
from mono_runtime.errors import MonoUnsupported
from mono_runtime.kernel import RUNTIME_ARGS, Compiled, registry
from mono_runtime.runner import MonoRunner

CFG = MiniMaxM3Config.tiny()
MX = FfnBuild(CFG, 2, 1, WeightFormat.MXFP4)
FP8 = FfnBuild(CFG, 2, 1, WeightFormat.FP8)
FRAG = FfnBuild(CFG, 2, 1, WeightFormat.MXFP4, frag=True)
FRAG8 = FfnBuild(MiniMaxM3Config(), 4, 4, WeightFormat.FP8, frag=True)  # a TP4 rank's


def test_every_build_is_registered_with_the_real_model_as_example():
    assert registry.get("ffn triton") is FfnTriton and registry.get("ffn flydsl") is FfnFlyDsl
    assert registry.get("ffn gluon") is FfnGluon
    assert registry.builds("ffn") == [FfnTriton, FfnFlyDsl, FfnGluon]
    assert FfnGluon.example().key.layout == "mxfp4-frag"
    example = FfnFlyDsl.example().key
    assert (example.cfg, example.rows, example.tp) == (MiniMaxM3Config(), 4, 4)
    assert example.weights is WeightFormat.MXFP4


def test_the_launch_spec_is_the_backends_keywords():
    names = list(launch_spec(MX).names)
    assert names == [p for p in inspect.signature(triton_build.kernel_args).parameters][1:]
    assert names == list(inspect.signature(flydsl_build.kernel_args).parameters)
    assert tuple(names[-len(RUNTIME_ARGS) :]) == flydsl_build.RUNTIME_ARGS
    assert launch_spec(MX).by_name["weights"].layout == "mxfp4-rot"  # MX.layout
    assert launch_spec(FP8).by_name["weights"].layout == "fp8-b128"


@pytest.mark.parametrize(
    ("build", "target", "says"),
    [
        (FfnTriton(MX), "sm90", None),
        (FfnTriton(MX), "sm100", None),
        (FfnTriton(FP8), "interpreter", None),
        (FfnTriton(MX), "gfx950", "on gfx950 its FlyDSL build does"),
        (FfnFlyDsl(MX), "gfx950", None),
        (FfnFlyDsl(MX), "gfx942", None),
        (FfnFlyDsl(MX), "sm90", "serves gfx950 and gfx942, not sm90"),
        (FfnFlyDsl(FP8), "gfx950", "fp8-b128 is served by the Triton build only"),
        (FfnGluon(FRAG), "sm90", None),
        (FfnGluon(FRAG), "sm100", None),
        (FfnGluon(FRAG), "interpreter", "Gluon has no interpreter"),
        (FfnGluon(FRAG), "sm80", "sm_90 and later, not sm80"),
        (FfnGluon(FRAG), "gfx950", "not gfx950"),
        (FfnGluon(MX), "sm90", "in their frag layouts (frag=True)"),
        (FfnGluon(FRAG8), "sm90", None),
        (FfnGluon(replace(FRAG8, cfg=CFG, tp=1)), "sm90", "one K step"),
        (FfnTriton(FRAG8), "sm90", "in the FFN's Gluon build"),
        (FfnTriton(FRAG), "sm90", "in the FFN's Gluon build"),
        # its bf16 shared expert's down stage, wrong on GPUs from 8 rows (build.sdown_fault)
        (FfnTriton(replace(MX, rows=8)), "sm90", "width 8: the FFN's Triton build computes"),
        (FfnTriton(replace(MX, rows=16)), "sm100", "its bf16 shared expert's down stage"),
        (FfnTriton(replace(MX, rows=16)), "interpreter", None),
        (FfnTriton(replace(MX, rows=7)), "sm90", None),
        (FfnTriton(replace(MX, rows=16, experts=Experts.ROUTED)), "sm90", None),
        (FfnTriton(replace(FP8, rows=16)), "sm90", None),
        (FfnGluon(replace(FRAG, tp=2)), "sm90", "one K step (routed down (I = 64 a rank)"),
    ],
)
def test_what_each_build_serves(build, target, says):
    got = build.supports(target)
    assert got == says if says is None else says in got


def test_compile_for_reports_each_backends_result(monkeypatch):
    seen = []
    kernel = SimpleNamespace(metadata=SimpleNamespace(shared=4096))
    monkeypatch.setattr(triton_build, "compile_for", lambda b, t: seen.append((b, t)) or kernel)
    assert FfnTriton(MX).compile_for("sm90") == Compiled("sm90", 4096)
    resources = SimpleNamespace(lds_bytes=512, vgpr_spills=0)
    isa = SimpleNamespace(resources=resources)
    monkeypatch.setattr(
        flydsl_build, "compile_isa", lambda bs, arch, processes: seen.append((bs, arch)) or [isa]
    )
    monkeypatch.setattr(flydsl_build, "residency_problem", lambda i: "8 CUs short")
    monkeypatch.setattr(ffn_build, "toolchain_missing", lambda: None)
    got = FfnFlyDsl(MX).compile_for("gfx950")
    assert got == Compiled("gfx950", 512, 0, "8 CUs short") and got.binary is isa
    assert seen == [(MX, "sm90"), ([MX], "gfx950")]
    monkeypatch.setattr(ffn_build, "toolchain_missing", lambda: "no ld.lld")
    with pytest.raises(MonoUnsupported, match="ffn flydsl gfx950: no ld.lld"):
        FfnFlyDsl(MX).compile_for("gfx950")
    with pytest.raises(MonoUnsupported, match="fp8"):
        FfnFlyDsl(FP8).compile_for("gfx950")
    assert len(seen) == 2  # nothing compiled for a refusal


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_closing_leaves_a_shared_runner_open_and_refuses_every_call(interpreter):
    fmt = WeightFormat.BF16
    mono = MonoRunner("cpu", None, 0, 1, 1 << 20, 1 << 20, deadline_ns=10**9)
    try:
        r = FfnRunner(CFG, fmt, None, 0, 1, "cpu", widths=(1,), runner=mono)
        r.step_begin()
        r.close()
        assert r.closed and not mono.closed  # its owner closes the shared runner
        part = torch.zeros(1, CFG.hidden_size, dtype=torch.bfloat16)
        calls = {
            "step_begin": r.step_begin,
            "after_step": r.after_step,
            "reset": r.reset,
            "inject": lambda: r.inject(None),
            "warm": r.warm,
            "region": lambda: r.region(1, "table"),
            "call": lambda: r(part, part, None, torch.zeros(1, dtype=torch.int64)),
        }
        for name, call in calls.items():
            with pytest.raises(RuntimeError, match="FfnRunner is closed"):
                call()
                pytest.fail(f"{name} ran after close")
    finally:
        mono.close()
    own = FfnRunner(CFG, fmt, None, 0, 1, "cpu", widths=(1,))
    own.close()
    assert own.mono.closed


def test_a_bad_launch_argument_is_named_before_the_kernel_sees_it(interpreter):
    with FfnRunner(CFG, WeightFormat.BF16, None, 0, 1, "cpu", widths=(1,)) as r:
        kernel = r.kernels[1]
        assert isinstance(kernel, FfnTriton) and kernel.key is r.builds[1]
        args = r._args(kernel.key, 1, *r._dummies(1))
        kernel.warm(r.programs, **args)  # the interpreter compiles nothing
        with pytest.raises(ValueError, match="ffn: argument 'slot': expected an int"):
            kernel.launch(r.programs, **{**args, "slot": 0.5})
        with pytest.raises(ValueError, match="ffn: argument 'part': expected \\*bf16"):
            kernel.launch(r.programs, **{**args, "part": args["part"].float()})
