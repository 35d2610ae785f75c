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


def _num(r: dict, col: str) -> float:
    """Row r's number in column col (0 where absent: files' blocks may differ in columns)."""
    try:
        return float((r.get(col) or "").replace(",", ""))
    except ValueError:
        return 0.0


def _key(head: list[str]) -> str | None:
    """The column naming a row: its SASS address, or its source line ("# Line", "Line No")."""
    return next((c for c in head if "Address" in c), None) or next(
        (c for c in head if c.strip("# ").lower() in ("line", "line no")), None
    )


def source_rows(text: str) -> list[dict]:
    """The source page's rows that carry samples. A header is a CSV line naming "Address"
    (SASS view) or the line (source view) and "Source"; the cuda view prints one block a
    file ("File Name", path; header; rows), and a file may come without metric columns
    (stop 53: K2's own file came first, bare), so every block is read and only those with
    a sampling column are kept, each row tagged with its file. Rows of another width than
    their header are dropped (ncu may print other lines)."""
    rows: list[dict] = []
    head: list[str] | None = None
    name = ""
    for f in csv.reader(io.StringIO(text)):
        if len(f) == 2 and f[0] == "File Name":
            name, head = f[1], None
        elif _key(f) is not None and "Source" in f:
            head = f if any("Sampling" in c for c in f) else None
        elif head is not None and len(f) == len(head):
            rows.append(dict(zip(head, f, strict=True)) | {"File": os.path.basename(name)})
    return rows


def _columns(rows: list[dict]) -> tuple[str, str, list[str]]:
    """(the all-samples column, the naming column, the stall-reason columns: of every
    row, since the files' blocks may differ in columns)."""
    cols = list(dict.fromkeys(c for r in rows for c in r))
    total_col = next(
        (c for c in cols if "Sampling" in c and "All" in c and "Not" not in c), None
    ) or next(c for c in cols if "Sampling" in c)
    reasons = [c for c in cols if ("stall" in c.lower()) and "Sampling" not in c]
    return total_col, _key(cols), reasons


def _line(r: dict, total: float, cols: tuple[str, str, list[str]], reasons: int) -> str:
    total_col, addr, why_cols = cols
    why = sorted(((_num(r, c), c) for c in why_cols), reverse=True)[:reasons]
    text = (r.get("Source") or "").strip()
    got = _num(r, total_col)
    where = f"{r['File']}:{r[addr]}" if r.get("File") else r[addr]
    return f"{where:>6} {got:7.0f} {100 * got / total:5.1f}%  {text[:60]:60}  " + ", ".join(
        f"{c}={v:.0f}" for v, c in why if v
    )


def top_lines(rows: list[dict], n: int) -> list[str]:
    """The whole kernel's share of samples by stall reason, then the n SASS lines with the
    most stall samples: address, samples, share, top reasons."""
    cols = _columns(rows)
    total_col, _, reasons = cols
    total = sum(_num(r, total_col) for r in rows) or 1.0
    out = [f"{total:.0f} samples in column {total_col!r}"]
    sums = sorted(((sum(_num(r, c) for r in rows), c) for c in reasons), reverse=True)
    out.append(
        "whole kernel: " + ", ".join(f"{c}={100 * v / total:.1f}%" for v, c in sums[:8] if v)
    )
    out += [_line(r, total, cols, 3) for r in sorted(rows, key=lambda r: -_num(r, total_col))[:n]]
    return out


def matching_lines(rows: list[dict], needles: list[str]) -> list[str]:
    """The source lines holding any of `needles`, in source order, each with its samples and
    top five stall reasons: one stage's own lines (K2's route runs on one program of 264,
    so its lines never reach the whole kernel's top)."""
    cols = _columns(rows)
    total = sum(_num(r, cols[0]) for r in rows) or 1.0
    hit = [r for r in rows if any(n in (r.get("Source") or "") for n in needles)]
    got = sum(_num(r, cols[0]) for r in hit)
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
            print(
                "no source rows with samples (no block carries a sampling column): "
                f"{src.stderr[-1500:]} {src.stdout[:1500]}"
            )
            continue
        print("\n".join(top_lines(rows, a.lines)))
        if a.match and view == "cuda":
            print("\n".join(matching_lines(rows, a.match.split(","))))


if __name__ == "__main__":
    main()
