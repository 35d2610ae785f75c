"""On a GPU: `mono qualify --ranks 1` passes (graph replay and the builds against their
references included), and `mono bench ffn|kda|allreduce --rows 1,2` and `mono bench gemv`
write their table, JSON and plot."""

import importlib.util
import json
import subprocess
import sys

import pytest


def _mono(*argv: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mono_tools.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_qualify_one_rank_on_the_gpu(tmp_path):
    path = tmp_path / "qualify.json"
    out = _mono("qualify", "--ranks", "1", "--json", str(path), timeout=580)
    print(out.stdout[-6000:], out.stderr[-3000:])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads(path.read_text())
    statuses = {c["name"]: c["status"] for c in data["checks"]}
    assert data["backend"] in ("cuda", "hip")
    for name in ("peer memory", "tagged all-reduce", "epoch wrap", "graph replay"):
        assert statuses[name] == "pass", (name, statuses)
    assert statuses["fault over deadline"] == "skip"  # one rank waits for nobody


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("kernel", "module"),
    [
        ("ffn", "mono_kernels_minimax.ffn.bench"),
        ("kda", "mono_kernels_kimi.kda.bench"),
        ("allreduce", "mono_runtime.allreduce"),
    ],
)
def test_bench_rows_1_2(tmp_path, kernel, module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is absent: no {kernel} bench to run")
    out = _mono("bench", kernel, "--rows", "1,2", "--out", str(tmp_path), timeout=580)
    print(out.stdout[-4000:], out.stderr[-3000:])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads((tmp_path / f"bench-{kernel}.json").read_text())
    assert [p["rows"] for p in data["points"]] == [1, 2]
    for point in data["points"]:
        assert point["kernel_us"] > 0 and point["baselines_us"]  # the op-by-op path ran
        assert all(v > 0 for v in point["baselines_us"].values())
        assert point["kernel_pct_of_limit"] > 0
    assert data["copy_gbps"] > 100
    assert (tmp_path / f"bench-{kernel}.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_bench_gemv_formats_and_cublas(tmp_path):
    argv = ("bench", "gemv", "--rows", "1,16", "--format", "bf16,mxfp4", "--out", str(tmp_path))
    out = _mono(*argv, timeout=580)
    print(out.stdout[-4000:], out.stderr[-3000:])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads((tmp_path / "bench-gemv.json").read_text())
    shapes = {p["case"][0] for p in data["points"]}
    assert len(shapes) == 2  # a projection's shape and a layer-size one
    assert {p["case"][1] for p in data["points"]} == {"bf16", "mxfp4"}
    assert {p["rows"] for p in data["points"]} == {1, 16}
    for point in data["points"]:
        assert point["kernel_us"] > 0 and point["baselines_us"]["cuBLAS bf16"] > 0
        assert 0 < point["kernel_pct_of_limit"] < 150
    assert (tmp_path / "bench-gemv.png").read_bytes()[:4] == b"\x89PNG"
