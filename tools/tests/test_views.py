"""The views of results: progress lines, tables, bench JSON and plot, from given figures."""

import io
import json

from mono_tools import table
from mono_tools.bench.plot import save
from mono_tools.bench.results import BenchResult, Point
from mono_tools.progress import Progress


def test_progress_without_a_terminal_prints_plain_lines():
    out = io.StringIO()
    progress = Progress(out, tty=False)
    progress.start("peer memory")
    progress.tick()
    progress.finish("peer memory", "pass", 1.25, "2 ranks")
    assert out.getvalue() == "..   peer memory\nok   peer memory    1.2 s  2 ranks\n"


def test_progress_on_a_terminal_redraws_one_line():
    out = io.StringIO()
    progress = Progress(out, tty=True)
    progress.start("epoch wrap")
    progress.tick()
    progress.finish("epoch wrap", "fail", 3.0, "wrong sum")
    text = out.getvalue()
    assert text.count("\r") >= 3 and "\n" not in text[: text.rindex("\r")]
    assert text.endswith("FAIL epoch wrap    3.0 s  wrong sum\n")


def test_table_aligns_columns():
    text = table.render(["a", "bb"], [["xyz", "1"], ["q", "22"]], right={1})
    assert text.splitlines() == ["a    bb", "---  --", "xyz   1", "q    22"]


def _result():
    return BenchResult(
        kernel="ffn",
        kernel_label="mono FFN",
        device="test device",
        copy_gbps=4000.0,
        points=[
            Point(1, kernel_us=20.0, baselines_us={"op-by-op": 60.0}, bytes_moved=40_000_000),
            Point(2, kernel_us=25.0, baselines_us={"op-by-op": 70.0}, bytes_moved=60_000_000),
        ],
        settings={"format": "mxfp4"},
    )


def test_bench_table_and_json_carry_the_memory_limit():
    result = _result()
    headers, rows = result.table()
    assert headers[:4] == ["rows", "kernel us", "op-by-op us", "speedup"]
    # 40 MB over 4000 GB/s is 10 us: 50% of the limit at 20 us, 17% at 60 us
    assert headers[4:] == ["floor us", "kernel GB/s", "kernel % limit", "op-by-op % limit"]
    assert rows[0] == ["1", "20.0", "60.0", "3.00x", "10.0", "2000", "50%", "17%"]
    data = json.loads(json.dumps(result.as_dict()))
    assert data["points"][1]["floor_us"] == 15.0
    assert data["points"][1]["kernel_pct_of_limit"] == 60.0
    assert data["points"][1]["kernel_gbps"] == 2400.0


def _cases():
    """Two shapes x two formats, a baseline per shape shared by its formats (gemv's kind)."""
    points = [
        Point(s, 5.0 * s * b, {"cuBLAS": 9.0 * s * n}, 10_000_000 * b * n, (f"{n}k", f"f{b}"))
        for n in (1, 2)
        for b in (1, 2)
        for s in (1, 4)
    ]
    return BenchResult("gemv", "mono GEMV", "dev", 4000.0, points, case_names=("shape", "fmt"))


def test_a_result_with_cases_leads_its_rows_with_them():
    headers, rows = _cases().table()
    assert headers[:3] == ["shape", "fmt", "rows"]
    assert rows[0][:4] == ["1k", "f1", "1", "5.0"] and rows[-1][:3] == ["2k", "f2", "4"]


def test_plot_writes_a_png(tmp_path):
    for result in (_result(), _cases()):  # one panel; a panel per shape
        path = tmp_path / f"bench-{result.kernel}.png"
        save(result, path)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
