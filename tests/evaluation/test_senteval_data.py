"""SentEval readers on the real files and on broken copies of them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from distributed_emb.evaluation.senteval_data import (
    BINARY_TASK_FILES,
    STS_YEAR_SUBSETS,
    SentEvalDataError,
    read_binary_task,
    read_mrpc,
    read_sick_relatedness,
    read_sst2,
    read_sts_benchmark,
    read_sts_subset,
    read_sts_year,
    read_trec,
    task_files,
    task_present,
)
from distributed_emb.paths import shipped_senteval_dir


@pytest.fixture(scope="session")
def sts_samples_dir(shared_data_dir) -> Path:
    return shared_data_dir / "senteval-samples" / "downstream"


def copy_task(source: Path, target: Path, task: str) -> Path:
    """A writable copy of `task`'s files under `target` (same layout)."""
    for relative in task_files(task):
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / relative, target / relative)
    return target


def replace_line(path: Path, line_no: int, new: bytes) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[line_no - 1] = new
    path.write_bytes(b"\n".join(lines))


def error_at(path: Path, line_no: int) -> str:
    return re.escape(f"{path}:{line_no}:")


# --- the real files ------------------------------------------------------------------------


def test_sts_benchmark_real_counts_and_quotes(senteval_dir):
    sizes = {s: len(read_sts_benchmark(senteval_dir, s)) for s in ("train", "dev", "test")}
    assert sizes == {"train": 5749, "dev": 1500, "test": 1379}
    test = read_sts_benchmark(senteval_dir, "test")
    assert test.sentences1[0] == "A girl is styling her hair."
    assert test.scores[0] == 2.5 and test.scores.min() >= 0 and test.scores.max() <= 5
    # Quoting is off: a sentence containing '"' stays whole and keeps its quotes.
    train = read_sts_benchmark(senteval_dir, "train")
    assert any('"' in s for s in train.sentences1 + train.sentences2)


def test_shipped_sts_benchmark_equals_shared_copy(senteval_dir):
    shipped = read_sts_benchmark(shipped_senteval_dir(), "dev")
    shared = read_sts_benchmark(senteval_dir, "dev")
    assert shipped.sentences1 == shared.sentences1
    np.testing.assert_array_equal(shipped.scores, shared.scores)


def test_sts_years_real_samples(sts_samples_dir):
    for year, subsets in STS_YEAR_SUBSETS.items():
        data = read_sts_year(sts_samples_dir, year)
        assert [d.name for d in data] == [f"{year}/{s}" for s in subsets]
        for d in data:
            # Every sample file has 40 lines; blank gold lines were dropped and counted.
            assert len(d) + d.n_unscored == 40
            assert len(d) > 0
    sts16 = read_sts_subset(sts_samples_dir, "STS16", "headlines")
    # STS16 inputs carry two source columns after the sentences; they must not leak in.
    assert all("Europe Media Monitor" not in s for s in sts16.sentences2)
    assert sum(d.n_unscored for d in read_sts_year(sts_samples_dir, "STS15")) == 113


def test_sick_real(senteval_dir):
    sizes = {s: len(read_sick_relatedness(senteval_dir, s)) for s in ("train", "dev", "test")}
    assert sizes == {"train": 4500, "dev": 500, "test": 4927}
    test = read_sick_relatedness(senteval_dir, "test")  # CRLF file: no '\r' may remain
    assert not any("\r" in s for s in test.sentences1 + test.sentences2)
    assert test.scores[0] == 3.3 and 1 <= test.scores.min() and test.scores.max() <= 5


@pytest.mark.parametrize(
    ("task", "size", "n_empty"),
    [("MR", 10662, 0), ("CR", 3775, 4), ("SUBJ", 10000, 0), ("MPQA", 10606, 3)],
)
def test_binary_tasks_real_counts_are_senteval_counts(senteval_dir, task, size, n_empty):
    data = read_binary_task(senteval_dir, task)
    assert len(data) == size and data.n_empty == n_empty
    n_positive = len((senteval_dir / BINARY_TASK_FILES[task][0]).read_bytes().splitlines())
    assert data.labels.tolist() == [1] * n_positive + [0] * (size - n_positive)


def test_sst2_trec_mrpc_real(senteval_dir):
    assert [len(read_sst2(senteval_dir, s)) for s in ("train", "dev", "test")] == [
        67349,
        872,
        1821,
    ]
    trec = read_trec(senteval_dir, "train")  # latin-1 file
    assert len(trec) == 5452 and len(read_trec(senteval_dir, "test")) == 500
    assert np.bincount(trec.labels).tolist() == [86, 1162, 1250, 1223, 835, 896]
    assert trec.sentences[0] == "How did serfdom develop in and then leave Russia ?"
    mrpc = read_mrpc(senteval_dir, "train")  # BOM + header skipped
    assert len(mrpc) == 4076 and len(read_mrpc(senteval_dir, "test")) == 1725
    assert mrpc.labels[0] == 1 and mrpc.sentences1[0].startswith("Amrozi accused his brother")


# --- broken copies -------------------------------------------------------------------------


def test_missing_file_is_named(tmp_path):
    with pytest.raises(SentEvalDataError, match=re.escape(str(tmp_path / "STS"))):
        read_sts_benchmark(tmp_path, "test")


def test_sts_benchmark_bad_score_and_short_row(senteval_dir, tmp_path):
    copy_task(senteval_dir, tmp_path, "STSBenchmark")
    path = tmp_path / "STS/STSBenchmark/sts-test.csv"
    replace_line(path, 3, b"g\tf\t2012\t1\tfive\tA b.\tC d.")
    with pytest.raises(SentEvalDataError, match=error_at(path, 3) + ".*'five' is not a number"):
        read_sts_benchmark(tmp_path, "test")
    replace_line(path, 3, b"g\tf\t2012\t1\t5.0\tonly one sentence")
    with pytest.raises(SentEvalDataError, match=error_at(path, 3) + ".*found 6"):
        read_sts_benchmark(tmp_path, "test")
    replace_line(path, 3, b"g\tf\t2012\t1\tnan\tA b.\tC d.")
    with pytest.raises(SentEvalDataError, match=error_at(path, 3) + ".*not finite"):
        read_sts_benchmark(tmp_path, "test")


def test_invalid_utf8_names_the_line(senteval_dir, tmp_path):
    copy_task(senteval_dir, tmp_path, "STSBenchmark")
    path = tmp_path / "STS/STSBenchmark/sts-dev.csv"
    replace_line(path, 7, b"g\tf\t2012\t1\t1.0\tA \xff b.\tC d.")
    with pytest.raises(SentEvalDataError, match=error_at(path, 7) + ".*utf-8"):
        read_sts_benchmark(tmp_path, "dev")


def test_sts_year_blank_gold_skipped_bad_gold_and_short_input(sts_samples_dir, tmp_path):
    copy_task(sts_samples_dir, tmp_path, "STS12")
    directory = tmp_path / "STS/STS12-en-test"
    gold = directory / "STS.gs.MSRpar.txt"
    inputs = directory / "STS.input.MSRpar.txt"
    original = read_sts_subset(tmp_path, "STS12", "MSRpar")
    replace_line(gold, 5, b"")  # an unscored pair: dropped with its input line
    data = read_sts_subset(tmp_path, "STS12", "MSRpar")
    assert len(data) == 39 and data.n_unscored == 1
    assert data.sentences1 == original.sentences1[:4] + original.sentences1[5:]
    np.testing.assert_array_equal(data.scores, np.delete(original.scores, 4))
    replace_line(gold, 6, b"4.x")
    with pytest.raises(SentEvalDataError, match=error_at(gold, 6)):
        read_sts_subset(tmp_path, "STS12", "MSRpar")
    replace_line(gold, 6, b"4.0")
    replace_line(inputs, 9, b"one sentence and no tab")
    with pytest.raises(SentEvalDataError, match=error_at(inputs, 9) + ".*two tab-separated"):
        read_sts_subset(tmp_path, "STS12", "MSRpar")
    inputs.write_bytes(b"a\tb\nc\td\n")
    with pytest.raises(SentEvalDataError, match="one gold line"):
        read_sts_subset(tmp_path, "STS12", "MSRpar")


def test_sick_header_and_columns(senteval_dir, tmp_path):
    copy_task(senteval_dir, tmp_path, "SICKRelatedness")
    path = tmp_path / "SICK/SICK_test_annotated.txt"
    replace_line(path, 10, b"9\tA man.\tA woman.\r")
    with pytest.raises(SentEvalDataError, match=error_at(path, 10) + ".*found 3"):
        read_sick_relatedness(tmp_path, "test")
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(lines[1:]))  # header removed: would silently lose a pair
    with pytest.raises(SentEvalDataError, match=error_at(path, 1) + ".*header"):
        read_sick_relatedness(tmp_path, "test")


def test_classification_readers_reject_bad_rows(senteval_dir, tmp_path):
    for task in ("SST2", "TREC", "MRPC"):
        copy_task(senteval_dir, tmp_path, task)
    sst = tmp_path / "SST/binary/sentiment-dev"
    replace_line(sst, 4, b"a fine film\t2")
    with pytest.raises(SentEvalDataError, match=error_at(sst, 4) + ".*not 0 or 1"):
        read_sst2(tmp_path, "dev")
    replace_line(sst, 4, b"a fine film")
    with pytest.raises(SentEvalDataError, match=error_at(sst, 4) + ".*found 1"):
        read_sst2(tmp_path, "dev")
    trec = tmp_path / "TREC/TREC_10.label"
    replace_line(trec, 2, b"COLOUR:dark What colour is the sky ?")
    with pytest.raises(SentEvalDataError, match=error_at(trec, 2) + ".*unknown class"):
        read_trec(tmp_path, "test")
    replace_line(trec, 2, b"What colour is the sky ?")
    with pytest.raises(SentEvalDataError, match=error_at(trec, 2) + ".*COARSE:fine"):
        read_trec(tmp_path, "test")
    mrpc = tmp_path / "MRPC/msr_paraphrase_test.txt"
    replace_line(mrpc, 3, b"1\t1\t2\tonly one string")
    with pytest.raises(SentEvalDataError, match=error_at(mrpc, 3) + ".*found 4"):
        read_mrpc(tmp_path, "test")


def test_binary_task_missing_one_file(senteval_dir, tmp_path):
    copy_task(senteval_dir, tmp_path, "CR")
    (tmp_path / "CR/custrev.neg").unlink()
    with pytest.raises(SentEvalDataError, match="custrev.neg: file not found"):
        read_binary_task(tmp_path, "CR")


def test_task_present_absent_or_incomplete(senteval_dir, tmp_path):
    assert task_present(senteval_dir, "MR")
    assert not task_present(tmp_path, "MR")
    copy_task(senteval_dir, tmp_path, "MR")
    (tmp_path / "MR/rt-polarity.pos").unlink()
    with pytest.raises(SentEvalDataError, match="incomplete.*rt-polarity.pos"):
        task_present(tmp_path, "MR")
