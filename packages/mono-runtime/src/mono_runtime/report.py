"""Benchmark rows as fixed-width text: what every kernel benchmark's command line prints."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def fixed_width(
    rows: Sequence[dict], columns: Sequence[tuple[str, str]], notes: Iterable[str] = ()
) -> str:
    """A header line of the `columns`' names, then one right-aligned line a row (each value
    by its column's format, "-" where missing or None), then the `notes` lines."""
    cells = [[name for name, _ in columns]] + [
        ["-" if r.get(n) is None else f.format(r[n]) for n, f in columns] for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(lines + list(notes))


def layer_table(rows: Sequence[dict], columns: Sequence[tuple[str, str]], where) -> str:
    """A layer kernel benchmark's rows (copy_tbps, layers, note): the table, the copy
    bandwidth and graph rotation of the run, then each row's note as `where(row): note`."""
    notes = []
    if rows:
        notes.append(
            f"copy bandwidth {rows[0]['copy_tbps']:.2f} TB/s; {rows[0]['layers']} layers a graph"
        )
    notes += [f"{where(r)}: {r['note']}" for r in rows if r.get("note")]
    return fixed_width(rows, columns, notes)
