"""mono_runtime.timeline on made-up stamps: rows from raw (program, ticket, start, ready,
end, mark) ns, and the per-stage table that splits each stage's time into waiting and work
(`show` and the picture: test_timing.py)."""

from __future__ import annotations

import pytest
import torch
from mono_runtime.timeline import (
    NO_MARK,
    STAMP_WORDS,
    critical_path,
    from_stamps,
    path_table,
    read_stamps,
    sharing,
    stamp_bytes,
    summary,
)

pytestmark = pytest.mark.timeout(30)

# two stages: "a" items do not wait; "b" items wait 3 us for "a", then work 1 us, the
# first 0.5 us before their mark; program 0 runs on SM 7, program 1 on SM 0 (the SM in the
# first word's high half)
SM7 = 7 << 32
STAMPS = [
    (SM7, 0, 1000, 1000, 5000, NO_MARK),
    (1, 1, 1000, 1000, 4000, NO_MARK),
    (SM7, 2, 5000, 8000, 9000, 8500),
    (1, 3, 4000, 7000, 8000, 7500),
]


def stage_of(t: int) -> str:
    return "a" if t < 2 else "b"


def test_a_stamp_is_six_words():
    assert STAMP_WORDS == 6 == len(STAMPS[0])
    assert stamp_bytes(3) == 3 * 6 * 8


def test_stamps_read_from_a_scratch_region_s_bytes():
    region = torch.tensor(STAMPS + [[9] * STAMP_WORDS], dtype=torch.int64).view(torch.uint8)
    assert read_stamps(region, len(STAMPS)) == [list(s) for s in STAMPS]


def test_rows_are_in_us_from_the_first_start():
    rows = from_stamps(STAMPS, stage_of)
    assert rows[2] == dict(
        program=0, sm=7, ticket=2, stage="b", start_us=4.0, ready_us=7.0, end_us=8.0, mark_us=7.5
    )
    assert rows[0]["mark_us"] is None
    assert (rows[1]["program"], rows[1]["sm"]) == (1, 0)
    assert [r["stage"] for r in rows] == ["a", "a", "b", "b"]


def test_summary_splits_each_stage_into_wait_and_work():
    lines = summary(from_stamps(STAMPS, stage_of)).splitlines()
    assert lines[0].split() == [
        "stage", "items", "first", "us", "last", "us", "mean", "us", "wait", "us", "work",
        "us", "ready", "by", "mark", "us",
    ]  # fmt: skip
    # a: 2 items, first 0, last 4, mean 3.5, no wait, work 3.5, ready by 0, no mark
    assert lines[1].split()[-1] == "-"
    assert [float(x) for x in lines[1].split()[1:-1]] == [2, 0.0, 4.0, 3.5, 0.0, 3.5, 0.0]
    # b: mean 4 (4 and 4), wait 3, work 1, the last ready at 7, marked 0.5 us into the work
    assert [float(x) for x in lines[2].split()[1:]] == [2, 3.0, 8.0, 4.0, 3.0, 1.0, 7.0, 0.5]
    assert lines[-1] == "span 8.0 us over 2 programs on 2 SMs"


def test_sharing_splits_each_stage_by_whether_an_sm_mate_overlapped():
    """Program 2 shares SM 7 with program 0 and runs while program 0's "b" item works:
    that item counts as shared, program 0's "a" item (before it) and program 1's as alone."""
    more = [(2 | SM7, 4, 8500, 8500, 9500, NO_MARK)]
    rows = from_stamps(STAMPS + more, lambda t: "ab"[min(t // 2, 1)])
    lines = sharing(rows).splitlines()
    assert lines[0].split() == ["stage", "alone", "work", "us", "shared", "work", "us"]
    assert lines[1].split() == ["a", "2", "3.50", "0", "-"]
    # b: program 1's item (1 us) alone; program 0's (8 -> 9 us) and program 2's share SM 7
    assert lines[2].split() == ["b", "1", "1.00", "2", "1.00"]
    one_sm = [(0, 0, 0, 0, 5, NO_MARK), (1, 1, 0, 0, 5, NO_MARK)]
    assert sharing(from_stamps(one_sm, lambda t: "a")) == ""


def test_critical_path_follows_inputs_then_programs():
    """A third stage "c" (ticket 4, program 1, ready at 8.5 us) waits for both "b" items:
    the later (ticket 2, ends at 8 us) held it. Ticket 2 started as its program's ticket 0
    ended (4 us), when its inputs had ended: its program held it, not an input, and its
    3 us from start to ready count as its hand-off. A ticket polling for its input itself
    (ready before the input's end) works from the input's end."""
    stamps = STAMPS + [(1, 4, 8000, 9500, 10000, NO_MARK)]
    rows = from_stamps(stamps, lambda t: "a" if t < 2 else "b" if t < 4 else "c")
    deps = {2: [0, 1], 3: [0, 1], 4: [2, 3]}
    chain = critical_path(rows, deps)
    assert [(c["ticket"], c["held_by"]) for c in chain] == [(0, ""), (2, "program"), (4, "input")]
    assert [c["handoff_us"] for c in chain] == pytest.approx([0.0, 3.0, 0.5])
    assert [c["work_us"] for c in chain] == pytest.approx([4.0, 1.0, 0.5])
    assert path_table(chain).splitlines()[-1] == "hand-offs 3.5 us, work 5.5 us over 3 items"
    rows[4]["ready_us"] = 7.5  # ticket 4 polled from 7.5 us, before ticket 2 ended at 8
    polled = critical_path(rows, deps)[-1]
    assert (polled["handoff_us"], polled["work_us"]) == pytest.approx((0.0, 1.0))
