"""Readers for SentEval's ``data/downstream`` layout.

Each reader mirrors what SentEval (facebookresearch/SentEval, and SimCSE's copy of it) does
with the same file, so our numbers are the protocol's numbers:

- sentences are whitespace-tokenised and re-joined with single spaces (SentEval splits every
  sentence into tokens and its batchers join them with ``' '``);
- STS-B and the STS12–16 inputs are tab separated with quoting off: a ``"`` is text;
- blank lines in STS12–16 gold files mark unscored pairs, which are dropped with their inputs.

Where SentEval would crash or silently misread (a missing file, a short row, a score that is
not a number), we raise :class:`SentEvalDataError` naming the file and the 1-based line.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class SentEvalDataError(ValueError):
    """A SentEval data file is missing or malformed; the message names file and line."""


@dataclass
class StsData:
    """Sentence pairs with gold similarity scores (one STS set or subset)."""

    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray  # (n,) float64 gold scores
    name: str

    def __post_init__(self) -> None:
        n = len(self.sentences1)
        if len(self.sentences2) != n or len(self.scores) != n:
            raise ValueError(
                f"{self.name}: {n} first sentences, {len(self.sentences2)} second sentences "
                f"and {len(self.scores)} scores; they must be equal"
            )

    def __len__(self) -> int:
        return len(self.sentences1)


def _where(path: Path, line_no: int) -> str:
    return f"{path}:{line_no}"


def read_lines(path: str | os.PathLike, encoding: str = "utf-8") -> list[str]:
    """The lines of `path` without line endings (``\\n``, ``\\r\\n`` or ``\\r``).

    Decoding is done line by line so that a bad byte is reported with its line number.
    """
    path = Path(path)
    if not path.is_file():
        raise SentEvalDataError(f"{path}: file not found")
    raw = path.read_bytes()
    # Split on bytes first: in a broken file we want the line number of the bad byte.
    lines = []
    for line_no, raw_line in enumerate(raw.splitlines(), start=1):
        try:
            lines.append(raw_line.decode(encoding))
        except UnicodeDecodeError as err:
            raise SentEvalDataError(
                f"{_where(path, line_no)}: not valid {encoding} ({err.reason} at byte {err.start})"
            ) from None
    # str.splitlines would also split on \x0b, \x1c, U+2028 ... inside a sentence; bytes
    # splitlines only splits on \n, \r\n and \r, which is what a line means in these files.
    return lines


def normalise_sentence(text: str) -> str:
    """SentEval's view of a sentence: whitespace tokens joined by single spaces."""
    return " ".join(text.split())


def parse_score(text: str, path: Path, line_no: int) -> float:
    """A finite float gold score, or an error naming file and line."""
    try:
        value = float(text)
    except ValueError:
        raise SentEvalDataError(
            f"{_where(path, line_no)}: score {text!r} is not a number"
        ) from None
    if not math.isfinite(value):
        raise SentEvalDataError(f"{_where(path, line_no)}: score {text!r} is not finite")
    return value


def read_sts_benchmark(senteval_dir: str | os.PathLike, split: str) -> StsData:
    """STS Benchmark ``STS/STSBenchmark/sts-{split}.csv`` (split: train, dev, test).

    Columns: genre, file, year, id, score, sentence1, sentence2; some rows carry extra source
    columns after the second sentence, which SentEval ignores and so do we. Tab separated with
    quoting off (``csv.QUOTE_NONE`` semantics): quotes are part of the sentences.
    """
    if split not in ("train", "dev", "test"):
        raise ValueError(f"STS-B split must be train, dev or test, not {split!r}")
    path = Path(senteval_dir) / "STS" / "STSBenchmark" / f"sts-{split}.csv"
    sentences1: list[str] = []
    sentences2: list[str] = []
    scores: list[float] = []
    for line_no, line in enumerate(read_lines(path), start=1):
        # SentEval: line.strip().split('\t'); strip() only removes the line's outer blanks.
        fields = line.strip().split("\t")
        if len(fields) < 7:
            raise SentEvalDataError(
                f"{_where(path, line_no)}: expected at least 7 tab-separated columns "
                f"(genre, file, year, id, score, sentence1, sentence2), found {len(fields)}"
            )
        scores.append(parse_score(fields[4], path, line_no))
        sentences1.append(normalise_sentence(fields[5]))
        sentences2.append(normalise_sentence(fields[6]))
    if not scores:
        raise SentEvalDataError(f"{path}: no sentence pairs")
    return StsData(sentences1, sentences2, np.asarray(scores, dtype=np.float64), f"STSB-{split}")
