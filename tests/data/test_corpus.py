import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_emb.data.corpus import CorpusError, read_rows


def write_bad_txt(path):
    lines = [
        b"A clean first sentence.\n",
        b"\n",  # empty
        b"   \t  \n",  # whitespace only
        b"A clean first sentence.\n",  # duplicate
        b"caf\xe9 is not UTF-8 here\n",  # invalid UTF-8 (latin-1 byte)
        b"  Padded sentence keeps its words.  \n",
        b"word " * 500 + b"\n",  # over-long: kept, truncated later by the tokenizer
        b"Last line without newline.",
    ]
    path.write_bytes(b"".join(lines))


def test_txt_every_bad_case_is_counted(tmp_path, caplog):
    path = tmp_path / "corpus.txt"
    write_bad_txt(path)
    rows, report = read_rows(str(path), deduplicate=True)
    assert rows["text"][0] == "A clean first sentence."
    assert "Padded sentence keeps its words." in rows["text"]
    assert report.kept == 4
    assert report.dropped == {"empty": 2, "duplicate": 1, "invalid_utf8": 1}
    assert report.total == 8
    # The invalid line is named with file and line number.
    assert report.examples["invalid_utf8"][0].startswith(f"{path}:5: ")


def test_jsonl_bad_rows_are_named_and_counted(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"text": "Good one."}),
                "{not json",
                json.dumps({"sentence": "wrong key"}),
                json.dumps({"text": 17}),
                json.dumps(["not", "an", "object"]),
                json.dumps({"text": "  "}),
                json.dumps({"text": "Good two."}),
            ]
        )
    )
    rows, report = read_rows(str(path))
    assert rows["text"] == ["Good one.", "Good two."]
    assert report.dropped == {
        "invalid_json": 1,
        "missing_field:text": 1,
        "not_text:text": 1,
        "not_an_object": 1,
        "empty": 1,
    }
    assert report.examples["invalid_json"] == [
        f"{path}:2: Expecting property name enclosed in double quotes"
    ]


def test_parquet_and_missing_column(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["One.", None, "Two.", "One."]}), path)
    rows, report = read_rows(str(path), deduplicate=True)
    assert rows["text"] == ["One.", "Two."]
    assert report.dropped == {"empty": 1, "duplicate": 1}
    with pytest.raises(CorpusError, match="no column 'sentence'"):
        read_rows(str(path), columns=["sentence"])


def test_hf_dataset_directory(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": ["Alpha.", "", "Beta."]}).save_to_disk(tmp_path / "ds")
    rows, report = read_rows(str(tmp_path / "ds"))
    assert rows["text"] == ["Alpha.", "Beta."]
    assert report.dropped == {"empty": 1}


def test_pairs_columns_and_max_rows(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        "\n".join(
            json.dumps({"anchor": f"a{i}", "positive": f"p{i}", "doc": "d"}) for i in range(10)
        )
    )
    rows, report = read_rows(
        str(path), columns=["anchor", "positive"], group_column="doc", max_rows=3
    )
    assert rows["anchor"] == ["a0", "a1", "a2"] and rows["doc"] == ["d", "d", "d"]


def test_unusable_inputs_raise_with_the_path(tmp_path):
    with pytest.raises(CorpusError, match="missing.txt: does not exist"):
        read_rows(str(tmp_path / "missing.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(CorpusError, match="no usable rows"):
        read_rows(str(empty))


def test_shipped_wikipedia_corpus_is_clean():
    from distributed_emb.paths import shipped_corpus

    rows, report = read_rows(shipped_corpus("wiki_sentences.txt"))
    assert report.kept == 17891 and not report.dropped


def test_a_local_corpus_too_small_for_one_step_fails_before_ray(tmp_path, capsys):
    from harness.jobs import run

    corpus = tmp_path / "tiny.txt"
    corpus.write_text("One.\nTwo.\n\nThree.\n")
    assert run("train_informin", [f"data.path={corpus}", "--output", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert f"{corpus}: 3 usable rows cannot fill one step of 64" in error
    assert "empty=1" in error
