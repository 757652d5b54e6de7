"""The one Markdown table writer."""

import pytest

from distributed_emb.tables import markdown_table


def test_header_rule_and_rows_with_escaped_pipes():
    table = markdown_table(["a", "b"], [["1", "x|y"], ["2", "z"]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |", "| 2 | z |"]


def test_right_aligned_columns_and_a_short_row():
    table = markdown_table(["n", "mode", "s"], [["1", "plain", "2.0"], ["3", "not run"]], "r-r")
    assert table.splitlines()[1:] == ["|---:|---|---:|", "| 1 | plain | 2.0 |", "| 3 | not run |"]


def test_bad_shapes_are_refused_naming_the_row():
    with pytest.raises(ValueError, match="row 1: 3 cells for 2 columns"):
        markdown_table(["a", "b"], [["1", "2"], ["1", "2", "3"]])
    with pytest.raises(ValueError, match="2 marks for 3 columns"):
        markdown_table(["a", "b", "c"], [], right_aligned="rr")
