"""Benchmark tables as data (JSON) and as markdown, one renderer for both outputs."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from distributed_emb.tables import markdown_table


@dataclass
class Table:
    key: str
    title: str
    columns: list[str]
    rows: list[list] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.key}: {len(cells)} cells for columns {self.columns}")
        self.rows.append(list(cells))

    def as_dict(self) -> dict:
        return {
            "title": self.title,
            "columns": self.columns,
            "rows": self.rows,
            "notes": self.notes,
        }


def median(values: list[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value):
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.{digits}f}"


def percent(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def ratio(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.2f}×"


def markdown(table: dict) -> str:
    lines = [f"### {table['title']}", ""]
    lines.append(
        markdown_table(table["columns"], ([fmt(cell) for cell in row] for row in table["rows"]))
    )
    for note in table.get("notes", []):
        lines.append("")
        lines.append(note)
    return "\n".join(lines)
