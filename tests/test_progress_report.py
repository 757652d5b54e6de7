"""Progress of long work (progress_report.py): a bar with total and ETA on a terminal, a line at
most a minute elsewhere, nothing when asked; and the chunked local encoding that feeds it
returns what one `encode` call returns."""

from __future__ import annotations

import io
import logging

import numpy as np

from distributed_emb.progress_report import (
    MODE_VARIABLE,
    Progress,
    polled_progress,
    progress_mode,
    set_progress,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "distributed_emb.progress_report"]


def test_off_a_terminal_one_line_a_minute_with_total_rate_and_eta(caplog):
    caplog.set_level(logging.INFO)
    clock = Clock()
    with Progress("embed", total=1200, unit="sentences", clock=clock, mode="lines") as progress:
        for _ in range(12):  # 100 sentences every 10 s: 120 s in all
            clock.now += 10
            progress.update(100)
    lines = _lines(caplog)
    # At 60 s and at 120 s; never more than one a minute; then the closing line.
    assert lines[:2] == [
        "embed: 600/1,200 sentences (50%), 10.0/s, ETA 1:00",
        "embed: 1,200/1,200 sentences (100%), 10.0/s, ETA 0:00",
    ]
    assert lines[2:] == ["embed: 1,200 sentences in 2:00 (10.0/s)"]


def test_short_work_off_a_terminal_says_nothing(caplog):
    caplog.set_level(logging.INFO)
    clock = Clock()
    with Progress("encode", total=10, clock=clock, mode="lines") as progress:
        clock.now += 5
        progress.update(10)
    assert _lines(caplog) == []


def test_an_unknown_total_gives_count_and_rate(caplog):
    caplog.set_level(logging.INFO)
    clock = Clock()
    progress = Progress("annotate", total=None, unit="documents", clock=clock, mode="lines")
    clock.now += 61
    progress.update(122)
    assert _lines(caplog) == ["annotate: 122 documents, 2.0/s"]


def test_off_means_silent(caplog):
    caplog.set_level(logging.INFO)
    clock = Clock()
    with Progress("embed", total=100, clock=clock, mode="off") as progress:
        clock.now += 600
        progress.update(100)
    assert _lines(caplog) == []


def test_on_a_terminal_a_bar_with_total_and_eta(capsys):
    with Progress("embed", total=100, unit="sentences", mode="bar") as progress:
        progress.update(40)
    drawn = capsys.readouterr().err
    assert "embed" in drawn and "40/100" in drawn and "<" in drawn  # elapsed<remaining


def test_the_mode_comes_from_the_setting_and_the_terminal(monkeypatch):
    monkeypatch.delenv(MODE_VARIABLE, raising=False)
    assert progress_mode(io.StringIO()) == "lines"  # not a terminal

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert progress_mode(Terminal()) == "bar"
    set_progress("auto")  # leaves the environment alone
    assert progress_mode(Terminal()) == "bar"
    set_progress("off")  # logging.progress_bar=off
    assert progress_mode(Terminal()) == "off"
    set_progress("on")
    assert progress_mode(io.StringIO()) == "bar"


def test_a_long_list_is_encoded_in_chunks_with_the_vectors_of_one_call(tiny_bert_path):
    from distributed_emb.model import embedder as embedder_module

    embedder = embedder_module.Embedder(tiny_bert_path, batch_size=2, max_seq_length=16)
    words = ["alpha", "beta gamma", "delta epsilon zeta", "eta", "theta iota kappa lambda"]
    sentences = [" ".join(words[: 1 + i % 5]) + f" {i}" for i in range(150)]
    assert len(sentences) > embedder.batch_size * embedder_module.BATCHES_PER_PROGRESS_STEP
    chunked = embedder.embed(sentences)
    whole = embedder.model.encode(sentences, batch_size=2, convert_to_numpy=True)
    np.testing.assert_allclose(chunked, whole, atol=1e-5)
    assert chunked.shape == (150, whole.shape[1])


def test_work_done_elsewhere_is_polled_into_lines_and_closed_with_its_count(caplog):
    caplog.set_level(logging.INFO)
    import threading

    done = {"rows": 0}
    polled = threading.Event()

    def read_done() -> int:
        done["rows"] += 250  # another process's counter moving on between reads
        polled.set()
        return done["rows"]

    with polled_progress(
        "token cache", 1000, "rows", read_done, every_s=0.01, mode="lines", line_every_s=0
    ) as progress:
        assert polled.wait(5)
    lines = _lines(caplog)
    assert lines and lines[0].startswith("token cache: 250/1,000 rows (25%)")
    # The last read at the end counts too: the closing line has every row read.
    assert progress.done == done["rows"] and f"{done['rows']:,} rows in" in lines[-1]


def test_polling_is_off_on_a_terminal_and_a_failing_count_fails_nothing(caplog):
    caplog.set_level(logging.INFO)
    with polled_progress("x", 10, "rows", lambda: 1 / 0, every_s=0.01, mode="bar") as progress:
        assert progress is None  # Ray Data draws its own bars there
    with polled_progress("x", 10, "rows", lambda: 1 / 0, every_s=0.01, mode="lines") as progress:
        pass
    assert progress.done == 0 and _lines(caplog) == []
