"""tools/ncu_top.py on a made-up Nsight Compute source page (no GPU or ncu needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "ncu_top", Path(__file__).resolve().parents[1] / "ncu_top.py"
)
ncu_top = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ncu_top)

PAGE = """==PROF== some banner
"# Line","Source","Warp Stall Sampling (All Samples)","stall_barrier","stall_mio_throttle"
"10","acc = tl.dot(a, b, acc)","900","100","700"
"20","best = tl.max(word, 0)","60","50","10"
"21","word = tl.where(word == best, _TAKEN, word)","40","0","30"
"30","tl.store(out, acc)","0","0","0"
"""


@pytest.mark.timeout(30)
def test_top_lines_and_matching_lines():
    rows = ncu_top.source_rows(PAGE)
    assert [r["# Line"] for r in rows] == ["10", "20", "21", "30"]
    top = ncu_top.top_lines(rows, 1)
    assert top[0].startswith("1000 samples") and "acc = tl.dot" in top[2]
    assert top[1] == "whole kernel: stall_mio_throttle=74.0%, stall_barrier=15.0%"
    got = ncu_top.matching_lines(rows, ["tl.max(word", "word == best"])
    assert got[0] == "2 lines holding ['tl.max(word', 'word == best']: 100 samples (10.00%)"
    assert "best = tl.max" in got[1] and "stall_barrier=50" in got[1]
    assert "word == best" in got[2] and "stall_mio_throttle=30" in got[2]
    assert ncu_top.matching_lines(rows, ["absent"]) == [
        "0 lines holding ['absent']: 0 samples (0.00%)"
    ]


# the cuda view as stop 53's ncu printed it: a block a file, the kernel's own file bare
FILES = """"File Name","/src/k2/triton_build.py"
"Line No","Source"
"1","\"\"\"Triton build of K2.\"\"\""
"File Name","/src/mono_runtime/topk_triton.py"
"Line No","Source","Warp Stall Sampling (All Samples)","stall_barrier"
"59","best = tl.max(word, 0)","80","70"
"61","word = tl.where(word == best, _TAKEN, word)","20","5"
"File Name","/src/mono_runtime/stream/frag_gluon.py"
"Line No","Source","Warp Stall Sampling (All Samples)","stall_long_sb"
"400","cp.wait_group(STAGES - 2)","300","250"
"""


@pytest.mark.timeout(30)
def test_source_rows_read_every_file_block():
    rows = ncu_top.source_rows(FILES)
    assert [(r["File"], r["Line No"]) for r in rows] == [
        ("topk_triton.py", "59"),
        ("topk_triton.py", "61"),
        ("frag_gluon.py", "400"),
    ]
    top = ncu_top.top_lines(rows, 1)
    assert top[0].startswith("400 samples") and top[2].startswith("frag_gluon.py:400")
    assert "stall_long_sb=250" in top[2]
    got = ncu_top.matching_lines(rows, ["tl.max(word"])
    assert got[0].endswith("80 samples (20.00%)") and "stall_barrier=70" in got[1]
    assert ncu_top.source_rows(FILES.split('"File Name","/src/mono_runtime/topk')[0]) == []
