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

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# SentEval's file conventions, its STS-B reader and the error every reader raises live below
# model/ and evaluation/ (the serving check of an export reads STS-B too); imported here under
# their old names.
from distributed_emb.data.senteval_files import SentEvalDataError as SentEvalDataError
from distributed_emb.data.senteval_files import StsData as StsData
from distributed_emb.data.senteval_files import normalise_sentence as normalise_sentence
from distributed_emb.data.senteval_files import parse_score as parse_score
from distributed_emb.data.senteval_files import read_lines as read_lines
from distributed_emb.data.senteval_files import read_sts_benchmark as read_sts_benchmark
from distributed_emb.data.senteval_files import scored_pairs as _scored_pairs
from distributed_emb.data.senteval_files import where as _where

# --- STS12–16 -------------------------------------------------------------------------------

# SentEval's subsets per year (senteval/sts.py). STS13 lacks "SMT" there for licence reasons.
STS_YEAR_SUBSETS: dict[str, tuple[str, ...]] = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}


def sts_year_dir(senteval_dir: str | os.PathLike, year: str) -> Path:
    return Path(senteval_dir) / "STS" / f"{year}-en-test"


def read_sts_subset(senteval_dir: str | os.PathLike, year: str, subset: str) -> StsData:
    """One STS12–16 subset: ``STS.input.<subset>.txt`` with ``STS.gs.<subset>.txt``.

    The input has the two sentences in its first two tab-separated columns (STS16 adds source
    columns, ignored). A blank gold line marks a pair that was not scored: SentEval drops it,
    and so do we, counting it in ``n_unscored``.
    """
    directory = sts_year_dir(senteval_dir, year)
    input_path = directory / f"STS.input.{subset}.txt"
    gold_path = directory / f"STS.gs.{subset}.txt"
    input_lines = read_lines(input_path)
    gold_lines = read_lines(gold_path)
    if len(input_lines) != len(gold_lines):
        raise SentEvalDataError(
            f"{gold_path}: {len(gold_lines)} lines, but {input_path.name} has "
            f"{len(input_lines)}; there must be one gold line (possibly blank) per pair"
        )
    sentences1: list[str] = []
    sentences2: list[str] = []
    scores: list[float] = []
    n_unscored = 0
    for line_no, (pair_line, gold_line) in enumerate(
        zip(input_lines, gold_lines, strict=True), start=1
    ):
        fields = pair_line.split("\t")
        if len(fields) < 2:
            raise SentEvalDataError(
                f"{_where(input_path, line_no)}: expected two tab-separated sentences, found "
                f"{len(fields)} column"
            )
        if not gold_line.strip():
            n_unscored += 1
            continue
        scores.append(parse_score(gold_line, gold_path, line_no))
        sentences1.append(normalise_sentence(fields[0]))
        sentences2.append(normalise_sentence(fields[1]))
    if not scores:
        raise SentEvalDataError(f"{gold_path}: no scored pairs")
    return StsData(
        sentences1,
        sentences2,
        np.asarray(scores, dtype=np.float64),
        f"{year}/{subset}",
        n_unscored=n_unscored,
    )


def read_sts_year(senteval_dir: str | os.PathLike, year: str) -> list[StsData]:
    """All of SentEval's subsets of one year (STS12 … STS16), in SentEval's order."""
    if year not in STS_YEAR_SUBSETS:
        raise ValueError(f"unknown STS year {year!r}; expected one of {list(STS_YEAR_SUBSETS)}")
    return [read_sts_subset(senteval_dir, year, subset) for subset in STS_YEAR_SUBSETS[year]]


# --- SICK relatedness -----------------------------------------------------------------------

SICK_FILES = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
SICK_HEADER = ("pair_ID", "sentence_A", "sentence_B", "relatedness_score")


def read_sick_relatedness(senteval_dir: str | os.PathLike, split: str) -> StsData:
    """SICK-R ``SICK/SICK_{train,trial,test_annotated}.txt`` (split: train, dev, test).

    A header row, then pair_ID, sentence_A, sentence_B, relatedness_score,
    entailment_judgment; tab separated, CRLF line ends in SentEval's test file.
    """
    if split not in SICK_FILES:
        raise ValueError(f"SICK split must be one of {list(SICK_FILES)}, not {split!r}")
    path = Path(senteval_dir) / "SICK" / SICK_FILES[split]
    lines = read_lines(path)
    # SentEval skips the first line unseen; we check it is the header, so that a file
    # without one does not silently lose its first pair.
    header = tuple(lines[0].strip().split("\t")[:4]) if lines else ()
    if header != SICK_HEADER:
        raise SentEvalDataError(
            f"{_where(path, 1)}: expected the header {' '.join(SICK_HEADER)} ..., found "
            f"{lines[0][:80]!r}"
            if lines
            else f"{path}: empty file"
        )
    return _scored_pairs(
        path, enumerate(lines[1:], start=2), SICK_HEADER, (3, 1, 2), f"SICK-{split}"
    )


# --- transfer (classification) tasks --------------------------------------------------------


@dataclass
class ClassificationData:
    """Single sentences with integer class labels."""

    sentences: list[str]
    labels: np.ndarray  # (n,) int64
    name: str
    n_empty: int = 0  # sentences with no tokens, kept as SentEval keeps them

    def __post_init__(self) -> None:
        if len(self.sentences) != len(self.labels):
            raise ValueError(
                f"{self.name}: {len(self.sentences)} sentences but {len(self.labels)} labels"
            )

    def __len__(self) -> int:
        return len(self.sentences)


@dataclass
class PairClassificationData:
    """Sentence pairs with integer labels (MRPC: 1 = paraphrase)."""

    sentences1: list[str]
    sentences2: list[str]
    labels: np.ndarray  # (n,) int64
    name: str

    def __post_init__(self) -> None:
        n = len(self.sentences1)
        if len(self.sentences2) != n or len(self.labels) != n:
            raise ValueError(
                f"{self.name}: {n} first sentences, {len(self.sentences2)} second sentences "
                f"and {len(self.labels)} labels; they must be equal"
            )

    def __len__(self) -> int:
        return len(self.sentences1)


# SentEval's (label 1 file, label 0 file) per binary task (senteval/binary.py). For SUBJ,
# SentEval passes the objective sentences as its "pos" argument, so objective = 1.
BINARY_TASK_FILES: dict[str, tuple[str, str]] = {
    "MR": ("MR/rt-polarity.pos", "MR/rt-polarity.neg"),
    "CR": ("CR/custrev.pos", "CR/custrev.neg"),
    "SUBJ": ("SUBJ/subj.objective", "SUBJ/subj.subjective"),
    "MPQA": ("MPQA/mpqa.pos", "MPQA/mpqa.neg"),
}


def read_binary_task(senteval_dir: str | os.PathLike, task: str) -> ClassificationData:
    """MR, CR, SUBJ or MPQA: one sentence per line, one file per class, read as latin-1.

    Lines with no tokens (CR and MPQA have a few, and CR's files end with one) are kept as
    empty sentences, exactly as SentEval keeps them, so sample counts and the
    cross-validation folds are SentEval's (CR 3,775, MPQA 10,606); ``n_empty`` counts them.
    """
    if task not in BINARY_TASK_FILES:
        raise ValueError(f"unknown binary task {task!r}; expected one of {list(BINARY_TASK_FILES)}")
    positive_file, negative_file = BINARY_TASK_FILES[task]
    sentences: list[str] = []
    labels: list[int] = []
    for label, relative in ((1, positive_file), (0, negative_file)):
        path = Path(senteval_dir) / relative
        # latin-1 decodes any byte, so these files cannot be "malformed"; only missing/empty.
        lines = read_lines(path, encoding="latin-1")
        if not any(line.strip() for line in lines):
            raise SentEvalDataError(f"{path}: no sentences")
        sentences.extend(normalise_sentence(line) for line in lines)
        labels.extend([label] * len(lines))
    n_empty = sum(1 for s in sentences if not s)
    return ClassificationData(sentences, np.asarray(labels, dtype=np.int64), task, n_empty)


SST2_FILES = {
    "train": "SST/binary/sentiment-train",
    "dev": "SST/binary/sentiment-dev",
    "test": "SST/binary/sentiment-test",
}


def read_sst2(senteval_dir: str | os.PathLike, split: str) -> ClassificationData:
    """SST-2 ``SST/binary/sentiment-{train,dev,test}``: ``sentence<TAB>label`` (0 or 1)."""
    if split not in SST2_FILES:
        raise ValueError(f"SST-2 split must be one of {list(SST2_FILES)}, not {split!r}")
    path = Path(senteval_dir) / SST2_FILES[split]
    sentences: list[str] = []
    labels: list[int] = []
    for line_no, line in enumerate(read_lines(path), start=1):
        fields = line.strip().split("\t")
        if len(fields) != 2:
            raise SentEvalDataError(
                f"{_where(path, line_no)}: expected 2 tab-separated columns (sentence, label), "
                f"found {len(fields)}"
            )
        if fields[1] not in ("0", "1"):
            raise SentEvalDataError(f"{_where(path, line_no)}: label {fields[1]!r} is not 0 or 1")
        sentences.append(normalise_sentence(fields[0]))
        labels.append(int(fields[1]))
    if not sentences:
        raise SentEvalDataError(f"{path}: no sentences")
    return ClassificationData(sentences, np.asarray(labels, dtype=np.int64), f"SST2-{split}")


TREC_FILES = {"train": "TREC/train_5500.label", "test": "TREC/TREC_10.label"}
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")  # SentEval's label order


def read_trec(senteval_dir: str | os.PathLike, split: str) -> ClassificationData:
    """TREC ``TREC/{train_5500,TREC_10}.label`` (latin-1): ``COARSE:fine question``.

    The coarse class (6 classes, SentEval's index order) is the label; the fine label that
    follows the colon is dropped, as SentEval does.
    """
    if split not in TREC_FILES:
        raise ValueError(f"TREC split must be one of {list(TREC_FILES)}, not {split!r}")
    path = Path(senteval_dir) / TREC_FILES[split]
    sentences: list[str] = []
    labels: list[int] = []
    for line_no, line in enumerate(read_lines(path, encoding="latin-1"), start=1):
        coarse, colon, rest = line.strip().partition(":")
        fine_and_question = rest.split(" ", 1)
        if not colon or len(fine_and_question) != 2:
            raise SentEvalDataError(
                f"{_where(path, line_no)}: expected 'COARSE:fine question', found {line[:60]!r}"
            )
        if coarse not in TREC_CLASSES:
            raise SentEvalDataError(
                f"{_where(path, line_no)}: unknown class {coarse!r}; expected one of "
                f"{', '.join(TREC_CLASSES)}"
            )
        sentences.append(normalise_sentence(fine_and_question[1]))
        labels.append(TREC_CLASSES.index(coarse))
    if not sentences:
        raise SentEvalDataError(f"{path}: no questions")
    return ClassificationData(sentences, np.asarray(labels, dtype=np.int64), f"TREC-{split}")


MRPC_FILES = {"train": "MRPC/msr_paraphrase_train.txt", "test": "MRPC/msr_paraphrase_test.txt"}


def read_mrpc(senteval_dir: str | os.PathLike, split: str) -> PairClassificationData:
    """MRPC ``MRPC/msr_paraphrase_{train,test}.txt``: header row, then
    Quality, #1 ID, #2 ID, #1 String, #2 String (tab separated, file starts with a BOM)."""
    if split not in MRPC_FILES:
        raise ValueError(f"MRPC split must be one of {list(MRPC_FILES)}, not {split!r}")
    path = Path(senteval_dir) / MRPC_FILES[split]
    lines = read_lines(path)
    if not lines or not lines[0].lstrip("\ufeff").startswith("Quality"):
        raise SentEvalDataError(f"{_where(path, 1)}: expected the header 'Quality\\t#1 ID...'")
    sentences1: list[str] = []
    sentences2: list[str] = []
    labels: list[int] = []
    for line_no, line in enumerate(lines[1:], start=2):
        fields = line.strip().split("\t")
        if len(fields) != 5:
            raise SentEvalDataError(
                f"{_where(path, line_no)}: expected 5 tab-separated columns (Quality, #1 ID, "
                f"#2 ID, #1 String, #2 String), found {len(fields)}"
            )
        if fields[0] not in ("0", "1"):
            raise SentEvalDataError(f"{_where(path, line_no)}: label {fields[0]!r} is not 0 or 1")
        labels.append(int(fields[0]))
        sentences1.append(normalise_sentence(fields[3]))
        sentences2.append(normalise_sentence(fields[4]))
    if not labels:
        raise SentEvalDataError(f"{path}: no sentence pairs")
    return PairClassificationData(
        sentences1, sentences2, np.asarray(labels, dtype=np.int64), f"MRPC-{split}"
    )


# --- which files each task needs (so the evaluator can skip absent tasks) -------------------


def task_files(task: str) -> list[str]:
    """Paths, relative to the SentEval directory, that `task` reads."""
    if task in STS_YEAR_SUBSETS:
        return [
            f"STS/{task}-en-test/STS.{kind}.{subset}.txt"
            for subset in STS_YEAR_SUBSETS[task]
            for kind in ("input", "gs")
        ]
    files = {
        "STSBenchmark": [f"STS/STSBenchmark/sts-{s}.csv" for s in ("train", "dev", "test")],
        "SICKRelatedness": [f"SICK/{name}" for name in SICK_FILES.values()],
        "SST2": list(SST2_FILES.values()),
        "TREC": list(TREC_FILES.values()),
        "MRPC": list(MRPC_FILES.values()),
        **{name: list(pair) for name, pair in BINARY_TASK_FILES.items()},
    }
    if task not in files:
        raise ValueError(f"unknown SentEval task {task!r}")
    return files[task]


def task_present(
    senteval_dir: str | os.PathLike, task: str, needed: list[str] | None = None
) -> bool:
    """Whether `task`'s files are in `senteval_dir`; it is absent when none of them exist.

    `needed` narrows the check to the files actually read (e.g. only STS-B test). A task with
    some but not all of its files is broken data, not an absent task: we raise, naming them.
    """
    relative = needed if needed is not None else task_files(task)
    missing = [r for r in relative if not (Path(senteval_dir) / r).is_file()]
    if not missing:
        return True
    if len(missing) == len(relative):
        return False
    raise SentEvalDataError(
        f"{senteval_dir}: task {task} is incomplete; missing {', '.join(missing)}"
    )


# --- where the task folders are -------------------------------------------------------------

# Every task task_files knows, in SentEval's order.
SENTEVAL_TASKS: tuple[str, ...] = (
    *STS_YEAR_SUBSETS,
    "STSBenchmark",
    "SICKRelatedness",
    *BINARY_TASK_FILES,
    "SST2",
    "TREC",
    "MRPC",
)
# The folders directly under data/downstream: STS, SICK, MR, CR, SUBJ, MPQA, SST, TREC, MRPC.
TASK_FOLDERS: tuple[str, ...] = tuple(
    dict.fromkeys(f.split("/")[0] for task in SENTEVAL_TASKS for f in task_files(task))
)
EXPECTED_LAYOUT = (
    "SentEval's data/downstream directory (or its parent data/), holding task folders such as "
    "STS/STSBenchmark/sts-test.csv, SICK/SICK_test_annotated.txt and MR/rt-polarity.pos, as "
    "SentEval's data/downstream/get_transfer_data.bash downloads them"
)


def _holds_task_folders(directory: Path) -> bool:
    return directory.is_dir() and any((directory / name).is_dir() for name in TASK_FOLDERS)


def find_downstream_dir(directory: str | os.PathLike) -> Path:
    """The folder holding the task folders (STS/, SICK/, MR/, ...), given `directory` as that
    folder (``data/downstream``), its parent (SentEval's ``data/``) or a SentEval checkout.

    Users point at ``data/`` as often as at ``data/downstream``; every task then looked absent
    and was skipped. Returns `directory` itself when no candidate holds a task folder.
    """
    base = Path(directory)
    for candidate in (base, base / "downstream", base / "data" / "downstream"):
        if _holds_task_folders(candidate):
            return candidate
    return base
