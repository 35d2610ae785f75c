"""`mono bench` from the arguments to the files, with the kernel packages' bench functions
replaced by given rows in their documented format (the GPU tests run the real ones)."""

import importlib
import importlib.machinery
import json
import sys
import types

import pytest
from mono_tools.bench import command
from mono_tools.cli import main
from mono_tools.machine import Machine

H200 = Machine(gpus=1, vendor="cuda", gpu_name="NVIDIA H200", cpus=16, torch="x", triton="y")


@pytest.fixture
def on_a_gpu(monkeypatch):
    monkeypatch.setattr(command, "detect", lambda: H200)


def _fake_module(monkeypatch, name: str, **functions):
    parent, _, child = name.rpartition(".")
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(functions)
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(importlib.import_module(parent), child, module, raising=False)


def test_bench_kda_table_json_and_plot(monkeypatch, tmp_path, capsys, on_a_gpu):
    seen = {}

    def rows(shapes):
        seen["shapes"] = shapes
        return [
            dict(
                R=r,
                L=1,
                S=r,
                layers=8,
                k1_us=10.0 * r,
                bytes=40_000_000,
                copy_GBps=4000.0,
                l2_x=6.04 * r,
                op_by_op_us=30.0 * r,
            )
            for r, _ in shapes
        ]

    _fake_module(monkeypatch, "mono_kernels_kimi.kda.bench", rows=rows)
    assert main(["bench", "kda", "--rows", "1,2", "--out", str(tmp_path)]) == 0
    assert seen == {"shapes": [(1, 1), (2, 1)]}
    data = json.loads((tmp_path / "bench-kda.json").read_text())
    assert data["settings"]["layers a timed graph"] == 8
    assert data["settings"]["graph reads / L2 (least)"] == 6.0
    assert [p["kernel_us"] for p in data["points"]] == [10.0, 20.0]
    assert data["points"][0]["kernel_pct_of_limit"] == 100.0  # 40 MB at 4 TB/s = 10 us
    assert (tmp_path / "bench-kda.png").exists()
    assert "3.00x" in capsys.readouterr().out


def test_bench_ffn_runs_both_formats_in_one_table_and_notes_a_failed_baseline(
    monkeypatch, tmp_path, capsys, on_a_gpu
):
    seen = {}

    def bench(rows, formats, engine):
        seen.update(formats=formats, engine=engine)
        build = {"fp8": ("triton", "fp8-b128"), "mxfp4": ("gluon", "mxfp4-frag")}
        return [
            dict(
                format=fmt,
                engine=build[fmt][0],
                layout=build[fmt][1],
                rows=s,
                kernel_us=8.0,
                bytes=16_000_000,
                copy_tbps=4.0,
                opbyop_us=None if s == 2 else 24.0,
                note="Boom" if s == 2 else None,
                # the FFN's rows name every baseline they timed (op-by-op and stock)
                baselines_us=None if s == 2 else {"op-by-op": 24.0, "stock": 12.0},
            )
            for fmt in formats
            for s in rows
        ]

    _fake_module(monkeypatch, "mono_kernels_minimax.ffn.bench", bench=bench)
    argv = ["bench", "ffn", "--rows", "1,2", "--format", "fp8,mxfp4", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert seen == {"formats": ("fp8", "mxfp4"), "engine": None}
    data = json.loads((tmp_path / "bench-ffn.json").read_text())
    assert data["case_names"] == ["format", "build"]
    assert [p["case"] for p in data["points"]] == [
        ["fp8", "triton fp8-b128"],
        ["fp8", "triton fp8-b128"],
        ["mxfp4", "gluon mxfp4-frag"],
        ["mxfp4", "gluon mxfp4-frag"],
    ]
    assert data["copy_gbps"] == 4000.0
    assert data["points"][0]["baselines_us"] == {"op-by-op": 24.0, "stock": 12.0}
    out = capsys.readouterr().out  # a speedup and a % of the limit for each baseline
    assert "speedup vs stock" in out and "3.00x" in out and "1.50x" in out
    assert "op-by-op % limit" in out and "stock % limit" in out
    assert "gluon mxfp4-frag" in out and "triton fp8-b128" in out
    assert data["points"][1]["baselines_us"] == {}
    assert data["settings"]["baseline failures"] == {
        "rows 2 format fp8 build triton fp8-b128": "Boom",
        "rows 2 format mxfp4 build gluon mxfp4-frag": "Boom",
    }
    assert "layers a timed graph" not in data["settings"]  # rows without the rotation columns
    assert (tmp_path / "bench-ffn.png").exists()


def _gemv_rows(rows):
    """stream.bench.measure's rows at one shape: every format, one failed, cuBLAS last."""
    out = []
    for fmt, per in (("bf16", 8_000_000), ("fp8", 4_000_000), ("mxfp4", 2_000_000)):
        for s in rows:
            row = dict(format=fmt, rows=s, n=2048, k=2048, layers=50, bytes=per)
            if fmt == "fp8" and s == 4:
                row["error"] = "CompilationError: no"
            else:
                row.update(rel_err=1e-3 * s, us=per / 4e6, tbps=4.0, pct_copy=100.0)
            out.append(row)
    out += [
        dict(format="cublas-bf16", rows=s, n=2048, k=2048, us=4.0 * s, bytes=8_000_000)
        for s in rows
    ]
    return out


def test_bench_gemv_table_json_and_plot(monkeypatch, tmp_path, capsys, on_a_gpu):
    seen = {}

    def measure(rows):
        seen["rows"] = rows
        return {"copy_bytes_per_s": 4e12, "rows": _gemv_rows(rows)}

    _fake_module(monkeypatch, "mono_runtime.stream.bench", measure=measure)
    argv = ["bench", "gemv", "--rows", "1,4", "--format", "fp8,mxfp4", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert seen == {"rows": (1, 4)}
    data = json.loads((tmp_path / "bench-gemv.json").read_text())
    cases = [(p["case"][1], p["rows"]) for p in data["points"]]
    assert cases == [("fp8", 1), ("mxfp4", 1), ("mxfp4", 4)]  # no bf16; fp8 S=4 failed
    assert {p["case"][0] for p in data["points"]} == {"2048x2048"}
    mx = data["points"][2]
    assert mx["baselines_us"] == {"cuBLAS bf16": 16.0}  # cuBLAS at the same shape and S
    assert mx["kernel_pct_of_limit"] == 100.0 and mx["kernel_gbps"] == 4000.0
    assert data["settings"]["failures"] == {"2048x2048 fp8 S=4": "CompilationError: no"}
    assert data["settings"]["relative error vs float64 (largest)"]["2048x2048 mxfp4"] == 4e-3
    assert data["copy_gbps"] == 4000.0 and data["case_names"] == ["N x K", "format"]
    assert (tmp_path / "bench-gemv.png").exists()
    out = capsys.readouterr().out
    assert "N x K" in out and "8.00x" in out  # cuBLAS 4 us over mxfp4's 0.5 us at S=1


def test_bench_gemv_reports_every_format_measured_by_default():
    from mono_tools.bench.gemv import result_of

    result = result_of({"copy_bytes_per_s": 4e12, "rows": _gemv_rows((1,))}, None, H200)
    assert [p.case[1] for p in result.points] == ["bf16", "fp8", "mxfp4"]  # no cuBLAS row


def test_bench_of_a_family_this_install_lacks_says_why(monkeypatch, capsys, on_a_gpu):
    from mono_runtime.kernel import registry
    from mono_tools import kernels

    monkeypatch.setattr(registry, "_BUILDS", {})
    monkeypatch.setattr(kernels, "load", lambda: {"mono_kernels_kimi.kda.build": "not here"})
    assert main(["bench", "kda", "--rows", "1"]) == 1
    assert "this install has no kda kernel (not here)" in capsys.readouterr().err


def test_bench_flags_are_refused_before_the_machine_is_looked_at(monkeypatch, capsys):
    monkeypatch.setattr(command, "detect", lambda: pytest.fail("detect ran"))
    assert main(["bench", "gemv", "--rows", "32"]) == 2
    assert "the GEMV serves at most 16 rows" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["bench", "kda", "--rows", "17"], "K1 serves at most 16 rows"),
        (["bench", "kda", "--format", "fp8"], "--format applies to `mono bench ffn|gemv` only"),
        (["bench", "ffn", "--format", "bf16"], "the FFN kernel reads mxfp4 or fp8"),
        (["bench", "gemv", "--rows", "1,32"], "--rows [32]: the GEMV serves at most 16 rows"),
        (["bench", "gemv", "--ranks", "1"], "--ranks applies to"),
        (["bench", "gemv", "--format", "mxfp4,mxfp4"], "a format appears twice"),
        (["bench", "ffn", "--rows", "32"], "serves at most 16 rows"),
        (["bench", "ffn", "--ranks", "2"], "--ranks applies to `mono bench allreduce` only"),
        (["bench", "allreduce", "--format", "fp8"], "--format applies to"),
        (["bench", "allreduce", "--ranks", "2"], "--ranks 2 needs 2 GPUs"),
        (["bench", "kda", "--engine", "gluon"], "--engine applies to `mono bench ffn|k2` only"),
        (["bench", "k2", "--engine", "cuda"], "--engine cuda: K2 builds are triton or gluon"),
    ],
)
def test_bench_refusals_on_a_gpu_machine(capsys, tmp_path, on_a_gpu, argv, says):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


@pytest.mark.parametrize("engine", [None, "gluon"])
def test_bench_k2_writes_its_rows(monkeypatch, tmp_path, on_a_gpu, engine):
    seen = []

    def bench(rows, engine):
        seen.append(engine)
        ran = engine or "triton"  # None: the runner's choice, which the rows name
        layout = "mxfp4-frag" if ran == "gluon" else "mxfp4-rot"  # K2Build.layout's
        return [dict(rows=s, engine=ran, layout=layout, kernel_us=20.0, bytes=80_000_000,
                     copy_tbps=4.0, layers=8, l2_x=30.0, opbyop_us=60.0, note=None)
                for s in rows]  # fmt: skip

    _fake_module(monkeypatch, "mono_kernels_kimi.k2.bench", bench=bench)
    flag = ["--engine", engine] if engine else []
    assert main(["bench", "k2", "--rows", "1,16", *flag, "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench-k2.json").read_text())
    assert seen == [engine]  # the flag as given: the runner picks the default build
    want = "gluon, mxfp4-frag" if engine else "triton, mxfp4-rot"
    assert data["kernel_label"] == f"mono K2 ({want})"
    assert [p["rows"] for p in data["points"]] == [1, 16]
    assert data["settings"]["model"] == "Kimi-K3" and data["settings"]["layers a timed graph"] == 8
    assert (tmp_path / "bench-k2.png").exists()


def test_bench_drafter_writes_its_rows(monkeypatch, tmp_path, on_a_gpu):
    seen = {}

    def bench(requests, contexts):
        seen["requests"], seen["contexts"] = requests, contexts
        return [dict(rows=r, requests=r, context=c, kernel_us=200.0, bytes=800_000_000,
                     copy_tbps=4.0, layers=5, l2_x=13.3, opbyop_us=900.0,
                     note="op-by-op path failed: OOM" if c == 32768 else None)
                for c in contexts for r in requests]  # fmt: skip

    _fake_module(monkeypatch, "mono_kernels_kimi.drafter.bench", bench=bench)
    assert main(["bench", "drafter", "--rows", "1,8", "--out", str(tmp_path)]) == 0
    assert seen == {"requests": (1, 8), "contexts": (1024, 8192, 32768)}
    data = json.loads((tmp_path / "bench-drafter.json").read_text())
    assert [(p["rows"], p["case"]) for p in data["points"][:3]] == [
        (1, ["1024"]),
        (8, ["1024"]),
        (1, ["8192"]),
    ]
    assert data["case_names"] == ["context"] and data["settings"]["layers a timed graph"] == 5
    assert data["points"][0]["kernel_pct_of_limit"] == 100.0  # 800 MB at 4 TB/s = 200 us
    assert data["settings"]["baseline failures"] == {
        "rows 1 context 32768": "op-by-op path failed: OOM",
        "rows 8 context 32768": "op-by-op path failed: OOM",
    }
    assert (tmp_path / "bench-drafter.png").exists()


def test_bench_drafter_refuses_more_than_one_launch(capsys, tmp_path, on_a_gpu):
    assert main(["bench", "drafter", "--rows", "1,16", "--out", str(tmp_path)]) == 2
    assert "the drafter serves at most 8 rows" in capsys.readouterr().err
