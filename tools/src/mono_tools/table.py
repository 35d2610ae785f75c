"""Plain-text tables for the terminal: the qualify result and the bench figures."""

from __future__ import annotations


def render(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """Columns as wide as their widest cell; columns in `right` are right-aligned (numbers)."""
    right = right or set()
    cells = [headers] + rows
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule] + [line(row) for row in rows])


def fit(text: str, width: int) -> str:
    """`text` cut to `width` characters, marked when cut (the JSON keeps all of it)."""
    return text if len(text) <= width else text[: width - 3] + "..."
