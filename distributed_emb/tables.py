"""The one Markdown table writer: results tables of training, search, MCR² and benchmarks."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(
    columns: Sequence[str], rows: Iterable[Sequence[str]], right_aligned: str | None = None
) -> str:
    """A GitHub Markdown table: header, rule, one line per row.

    Cells are strings, formatted by the caller; a `|` inside a cell is escaped so it cannot
    split the cell. `right_aligned`, one character per column ("r" right-aligns it, "-" leaves
    it plain), is for tables of numbers. A row may have fewer cells than there are columns
    (a note that spans the rest), never more.
    """
    columns = list(columns)
    if right_aligned is not None and len(right_aligned) != len(columns):
        raise ValueError(
            f"right_aligned {right_aligned!r} has {len(right_aligned)} marks for "
            f"{len(columns)} columns"
        )
    marks = right_aligned or "-" * len(columns)
    lines = [
        _line(columns),
        "|" + "|".join("---:" if mark == "r" else "---" for mark in marks) + "|",
    ]
    for number, row in enumerate(rows):
        row = list(row)
        if len(row) > len(columns):
            raise ValueError(f"row {number}: {len(row)} cells for {len(columns)} columns {columns}")
        lines.append(_line(row))
    return "\n".join(lines)


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"
