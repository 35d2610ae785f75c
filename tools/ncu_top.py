"""Where a kernel's warps wait, from an Nsight Compute report (GPU machine, no counters
needed here): the SASS lines with the most warp-stall samples, each with its top stall
reasons, and the report's own details pages (speed of light, occupancy, warp states).

    python3 tools/ncu_top.py REPORT.ncu-rep [--lines 40] [--views cuda,sass] [--match TEXT,...]

Reads `ncu --import REPORT --page source --csv --print-source sass`; the column names
are matched loosely (they move between Nsight Compute versions)."""

from __future__ import annotations

import argparse
import csv
import io
import os
import subprocess

NCU = os.environ.get("NCU", "ncu")  # the ncu binary (tools/gpu_session.sh finds it)


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def _key(head: list[str]) -> str | None:
    """The column naming a row: its SASS address, or its source line."""
    return next((c for c in head if "Address" in c), None) or next(
        (c for c in head if c.strip("# ").lower() == "line"), None
    )


def source_rows(text: str) -> list[dict]:
    """The source page's rows: the header is the first CSV line naming "Address" (SASS
    view) or "Line" (source view) and "Source" (ncu may print other lines first); rows of
    another width are dropped."""
    lines = list(csv.reader(io.StringIO(text)))
    start = next(
        (i for i, f in enumerate(lines) if _key(f) is not None and "Source" in f),
        None,
    )
    if start is None:
        return []
    head = lines[start]
    return [dict(zip(head, f, strict=True)) for f in lines[start + 1 :] if len(f) == len(head)]


def _columns(rows: list[dict]) -> tuple[str, str, list[str]]:
    """(the all-samples column, the naming column, the stall-reason columns)."""
    cols = list(rows[0])
    total_col = next(
        (c for c in cols if "Sampling" in c and "All" in c and "Not" not in c), None
    ) or next(c for c in cols if "Sampling" in c)
    reasons = [c for c in cols if ("stall" in c.lower()) and "Sampling" not in c]
    return total_col, _key(cols), reasons


def _line(r: dict, total: float, cols: tuple[str, str, list[str]], reasons: int) -> str:
    total_col, addr, why_cols = cols
    why = sorted(((_num(r[c]), c) for c in why_cols), reverse=True)[:reasons]
    text = (r.get("Source") or "").strip()
    got = _num(r[total_col])
    return f"{r[addr]:>6} {got:7.0f} {100 * got / total:5.1f}%  {text[:60]:60}  " + ", ".join(
        f"{c}={v:.0f}" for v, c in why if v
    )


def top_lines(rows: list[dict], n: int) -> list[str]:
    """The whole kernel's share of samples by stall reason, then the n SASS lines with the
    most stall samples: address, samples, share, top reasons."""
    cols = _columns(rows)
    total_col, _, reasons = cols
    total = sum(_num(r[total_col]) for r in rows) or 1.0
    out = [f"{total:.0f} samples in column {total_col!r}"]
    sums = sorted(((sum(_num(r[c]) for r in rows), c) for c in reasons), reverse=True)
    out.append(
        "whole kernel: " + ", ".join(f"{c}={100 * v / total:.1f}%" for v, c in sums[:8] if v)
    )
    out += [_line(r, total, cols, 3) for r in sorted(rows, key=lambda r: -_num(r[total_col]))[:n]]
    return out


def matching_lines(rows: list[dict], needles: list[str]) -> list[str]:
    """The source lines holding any of `needles`, in source order, each with its samples and
    top five stall reasons: one stage's own lines (K2's route runs on one program of 264,
    so its lines never reach the whole kernel's top)."""
    cols = _columns(rows)
    total = sum(_num(r[cols[0]]) for r in rows) or 1.0
    hit = [r for r in rows if any(n in (r.get("Source") or "") for n in needles)]
    got = sum(_num(r[cols[0]]) for r in hit)
    out = [f"{len(hit)} lines holding {needles}: {got:.0f} samples ({100 * got / total:.2f}%)"]
    return out + [_line(r, total, cols, 5) for r in hit]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("report")
    p.add_argument("--lines", type=int, default=40)
    p.add_argument("--views", default="cuda,sass", help="source views: cuda (lines), sass")
    p.add_argument(
        "--match",
        default="",
        help="comma-separated texts: also print every source line holding one (cuda view)",
    )
    a = p.parse_args()
    details = subprocess.run(
        [NCU, "--import", a.report, "--page", "details"], capture_output=True, text=True
    )
    print(details.stdout[-12000:], details.stderr[-2000:])
    for view in a.views.split(","):
        src = subprocess.run(
            [NCU, "--import", a.report, "--page", "source", "--csv", "--print-source", view],
            capture_output=True,
            text=True,
        )
        rows = source_rows(src.stdout)
        print(f"-- {view}")
        if not rows:
            print(f"no source rows: {src.stderr[-1500:]} {src.stdout[:1500]}")
            continue
        print("\n".join(top_lines(rows, a.lines)))
        if a.match and view == "cuda":
            print("\n".join(matching_lines(rows, a.match.split(","))))


if __name__ == "__main__":
    main()
