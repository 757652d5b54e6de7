"""SentEval's file conventions and its STS Benchmark reader, below model/ and evaluation/.

Every STS-B score reads STS-B through here: the serving check of an export
(model/serving_check.py), the in-training dev metric and the evaluator (evaluation/sts.py).
evaluation/senteval_data.py builds SentEval's other readers (STS12–16, SICK-R, the transfer
tasks) on the same conventions, mirroring what SentEval (facebookresearch/SentEval, and
SimCSE's copy of it) does with each file, so our numbers are the protocol's numbers:

- sentences are whitespace-tokenised and re-joined with single spaces (SentEval splits every
  sentence into tokens and its batchers join them with ``' '``);
- STS-B is tab separated with quoting off: a ``"`` is text.

Where SentEval would crash or silently misread (a missing file, a short row, a score that is
not a number), we raise :class:`SentEvalDataError` naming the file and the 1-based line.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distributed_emb.errors import UserInputError
from distributed_emb.paths import shipped_senteval_dir


class SentEvalDataError(UserInputError):
    """A SentEval data file is missing or malformed; the message names file and line."""


@dataclass
class StsData:
    """Sentence pairs with gold similarity scores (one STS set or subset)."""

    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray  # (n,) float64 gold scores
    name: str
    n_unscored: int = 0  # pairs dropped because their gold line was blank (STS12–16)

    def __post_init__(self) -> None:
        n = len(self.sentences1)
        if len(self.sentences2) != n or len(self.scores) != n:
            raise ValueError(
                f"{self.name}: {n} first sentences, {len(self.sentences2)} second sentences "
                f"and {len(self.scores)} scores; they must be equal"
            )

    def __len__(self) -> int:
        return len(self.sentences1)


def where(path: Path, line_no: int) -> str:
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
                f"{where(path, line_no)}: not valid {encoding} ({err.reason} at byte {err.start})"
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
        raise SentEvalDataError(f"{where(path, line_no)}: score {text!r} is not a number") from None
    if not math.isfinite(value):
        raise SentEvalDataError(f"{where(path, line_no)}: score {text!r} is not finite")
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
    columns = ("genre", "file", "year", "id", "score", "sentence1", "sentence2")
    return scored_pairs(
        path, enumerate(read_lines(path), start=1), columns, (4, 5, 6), f"STSB-{split}"
    )


def scored_pairs(
    path: Path,
    numbered_lines,
    columns: tuple[str, ...],
    score_first_second: tuple[int, int, int],
    name: str,
) -> StsData:
    """Tab-separated (line number, line) rows → StsData; the three indexes say which columns
    hold the score and the two sentences. A short row or a bad score names the file and line."""
    score_at, first_at, second_at = score_first_second
    sentences1: list[str] = []
    sentences2: list[str] = []
    scores: list[float] = []
    for line_no, line in numbered_lines:
        # SentEval: line.strip().split('\t'); strip() only removes the line's outer blanks.
        fields = line.strip().split("\t")
        if len(fields) < len(columns):
            raise SentEvalDataError(
                f"{where(path, line_no)}: expected at least {len(columns)} tab-separated "
                f"columns ({', '.join(columns)}), found {len(fields)}"
            )
        scores.append(parse_score(fields[score_at], path, line_no))
        sentences1.append(normalise_sentence(fields[first_at]))
        sentences2.append(normalise_sentence(fields[second_at]))
    if not scores:
        raise SentEvalDataError(f"{path}: no sentence pairs")
    return StsData(sentences1, sentences2, np.asarray(scores, dtype=np.float64), name)


def read_stsb(split: str, senteval_dir: str | None = None, max_pairs: int | None = None) -> StsData:
    """STS-B `split` from `senteval_dir` (the shipped copy when None), its first `max_pairs`
    pairs when given."""
    data = read_sts_benchmark(senteval_dir or shipped_senteval_dir(), split)
    if max_pairs is None:
        return data
    n = max_pairs
    return StsData(data.sentences1[:n], data.sentences2[:n], data.scores[:n], data.name)
