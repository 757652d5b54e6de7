"""The one reader layer: every format and compression, line ends, mixed directories, unknown
suffixes, over-long lines, and drop counts that do not depend on how blocks are cut."""

import bz2
import gzip
import json
import random
import re
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_emb.data.corpus import read_rows
from distributed_emb.data.readers import (
    TOO_LONG,
    DropReport,
    TextRows,
    iter_lines,
    iter_parsed_blocks,
)
from distributed_emb.data.sources import CorpusError, resolve_sources


def _lines(data: bytes, max_bytes: int = 100, chunk: int = 3):
    stream = iter([data[i : i + chunk] for i in range(0, len(data), chunk)] + [b""])
    return list(iter_lines(lambda _n: next(stream), max_bytes, chunk))


@pytest.mark.parametrize(
    "data",
    [b"a\nbb\nccc\n", b"a\r\nbb\r\nccc\r\n", b"a\rbb\rccc\r", b"a\rbb\r\nccc", b"a\nbb\rccc"],
)
def test_lf_crlf_and_cr_line_ends_split_alike(data):
    assert _lines(data) == [b"a", b"bb", b"ccc"]


def test_empty_lines_are_kept_as_lines():
    assert _lines(b"a\n\nb\r\n\r\nc") == [b"a", b"", b"b", b"", b"c"]


def test_an_over_long_line_is_skipped_while_streaming_and_counted_once():
    data = b"short\n" + b"x" * 1000 + b"\nafter\r\n" + b"y" * 50 + b"\rend"
    assert _lines(data, max_bytes=40) == [b"short", TOO_LONG, b"after", TOO_LONG, b"end"]


def write_mixed_directory(root):
    """Four formats, two compressions, one subdirectory: 2 rows each, 1 bad row in jsonl."""
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"Alpha one.\r\nAlpha two.\r\n")
    (root / "b.jsonl").write_text(
        json.dumps({"text": "Beta one."}) + "\n{broken\n" + json.dumps({"text": "Beta two."})
    )
    pq.write_table(pa.table({"text": ["Gamma one.", "Gamma two."]}), root / "c.parquet")
    (root / "sub" / "d.txt").write_bytes(b"Delta one.\rDelta two.\r")
    with gzip.open(root / "sub" / "e.jsonl.gz", "wt") as handle:
        handle.write(json.dumps({"text": "Eps one."}) + "\n" + json.dumps({"text": "Eps two."}))
    (root / "f.txt.bz2").write_bytes(bz2.compress(b"Zeta one.\nZeta two.\n"))
    (root / "_SUCCESS").write_text("")
    (root / ".hidden").write_text("not data")


def test_mixed_directory_reads_every_file_by_its_suffix(tmp_path):
    write_mixed_directory(tmp_path / "corpus")
    files = resolve_sources(str(tmp_path / "corpus"))
    assert [(f.format, f.compression) for f in files.files] == [
        ("txt", None), ("jsonl", None), ("parquet", None), ("txt", "bz2"),
        ("txt", None), ("jsonl", "gzip"),
    ]  # fmt: skip
    rows, report = read_rows(str(tmp_path / "corpus"))
    assert sorted(rows["text"]) == sorted(
        f"{name} {n}." for name in ("Alpha", "Beta", "Gamma", "Delta", "Eps", "Zeta")
        for n in ("one", "two")
    )  # fmt: skip
    assert report.dropped == {"invalid_json": 1}
    assert report.examples["invalid_json"][0].startswith(f"{tmp_path / 'corpus' / 'b.jsonl'}:2")


def test_zstd_and_globs(tmp_path):
    with pa.CompressedOutputStream(str(tmp_path / "x.jsonl.zst"), "zstd") as handle:
        handle.write(json.dumps({"text": "Zstd row."}).encode())
    (tmp_path / "y.txt").write_text("Plain row.\n")
    rows, _ = read_rows(str(tmp_path / "*.jsonl.zst"))
    assert rows["text"] == ["Zstd row."]


def test_unknown_suffix_is_an_error_listing_the_file(tmp_path):
    (tmp_path / "a.txt").write_text("One.\n")
    (tmp_path / "notes.md").write_text("# not a corpus\n")
    (tmp_path / "data.csv").write_text("text\nx\n")
    with pytest.raises(CorpusError, match=r"2 file\(s\).*data\.csv.*notes\.md"):
        resolve_sources(str(tmp_path))


def test_missing_source_names_it(tmp_path):
    with pytest.raises(CorpusError, match="missing.txt: does not exist"):
        resolve_sources(str(tmp_path / "missing.txt"))


def test_hub_name_offline_says_how_to_proceed(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CorpusError, match="HF_HUB_OFFLINE=1"):
        resolve_sources("wikimedia/wikipedia")


def test_hub_dataset_parquet_files_are_found_by_split(tmp_path, monkeypatch):
    """The hub layout (data/<split>-NNNNN-of-NNNNN.parquet), served by a local filesystem in
    place of the hub's fsspec filesystem."""
    import pyarrow.fs as pafs

    from distributed_emb.data import sources

    root = tmp_path / "datasets" / "org" / "wiki" / "data"
    root.mkdir(parents=True)
    pq.write_table(pa.table({"text": ["Train row."]}), root / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": ["Test row."]}), root / "test-00000-of-00001.parquet")
    local = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    monkeypatch.setattr(sources, "_hub_filesystem", lambda: local)
    for spec in ("org/wiki", "hf://datasets/org/wiki"):
        rows, _ = read_rows(spec)
        assert rows["text"] == ["Train row."]
    rows, _ = read_rows("org/wiki", hf_split="test")
    assert rows["text"] == ["Test row."]


def test_saved_hf_dataset_directory_and_dict(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": ["Alpha.", "", "Beta."]}).save_to_disk(tmp_path / "ds")
    rows, report = read_rows(str(tmp_path / "ds"))
    assert rows["text"] == ["Alpha.", "Beta."] and report.dropped == {"empty": 1}
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"text": ["T."]}),
         "validation": datasets.Dataset.from_dict({"text": ["V."]})}
    ).save_to_disk(tmp_path / "dd")  # fmt: skip
    assert read_rows(str(tmp_path / "dd"), hf_split="validation")[0]["text"] == ["V."]
    with pytest.raises(CorpusError, match="no split 'test'"):
        read_rows(str(tmp_path / "dd"), hf_split="test")


def test_over_long_rows_are_dropped_and_counted(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text(
        json.dumps({"text": "ok"}) + "\n" + json.dumps({"text": "x" * 500}) + "\n"
        + "y" * 5000 + "\n" + json.dumps({"text": "ok too"})
    )  # fmt: skip
    rows, report = read_rows(str(path), max_chars=100)
    assert rows["text"] == ["ok", "ok too"]
    assert report.dropped == {"too_long": 2}


def test_drop_counts_do_not_depend_on_block_size(tmp_path):
    lines = []
    for i in range(103):
        lines.append(json.dumps({"text": f"row {i}"}) if i % 7 else "{bad")
        if i % 11 == 0:
            lines.append("")
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines))
    files, rules = resolve_sources(str(path)), TextRows(["text"])
    reports = []
    for block_rows in (1000, 26, 1):
        report = DropReport()
        blocks = list(iter_parsed_blocks(files, rules, block_rows))
        for block in blocks:
            report.merge(DropReport.of_block(block))
        reports.append(report.as_dict())
        assert len(blocks) == -(-len(lines) // block_rows)
    assert reports[0] == reports[1] == reports[2]
    assert reports[0]["dropped"] == {"invalid_json": 15, "blank_line": 10}


def test_vectorised_parquet_rules_equal_the_per_row_rules():
    """Parquet/Arrow batches are normalised in Arrow compute; the result must be the per-row
    rules' result, reason for reason."""
    rules = TextRows(["anchor", "positive"], group_column="doc", max_chars=10)
    table = pa.table(
        {
            "anchor": ["a", None, "  ", "x" * 11, " keep me ", "b", "c"],
            "positive": ["p", "q", "r", "s", "t  ", None, "   "],
            "doc": [1, 2, 3, 4, 5, 6, None],
        }
    )
    values, reasons, _ = rules.normalise_arrow(table)
    for index, record in enumerate(table.to_pylist()):
        expected, reason, _ = rules.normalise(record)
        assert reasons[index] == reason, (index, record)
        got = {name: values.column(name)[index].as_py() for name in rules.fields}
        assert got == (expected or dict.fromkeys(rules.fields)), (index, record)
    numbers = TextRows(["text"]).normalise_arrow(pa.table({"text": [1, None]}))[1]
    assert list(numbers) == ["not_text:text", "empty"]


@pytest.mark.parametrize("suffix", ["txt", "jsonl.gz", "parquet", "arrow"])
def test_blocks_are_exactly_block_rows_whatever_the_file_is_cut_into(tmp_path, suffix):
    from distributed_emb.data.readers import read_file_blocks

    texts = [f"sentence {n}" if n % 7 else "" for n in range(1, 96)]  # some rows dropped
    path = tmp_path / f"corpus.{suffix}"
    if suffix == "txt":
        path.write_text("\n".join(texts) + "\n")
    elif suffix == "jsonl.gz":
        path.write_bytes(gzip.compress("\n".join(json.dumps({"text": t}) for t in texts).encode()))
    elif suffix == "parquet":  # several row groups, not aligned with the blocks
        pq.write_table(pa.table({"text": texts}), path, row_group_size=17)
    else:
        with pa.ipc.new_stream(str(path), pa.schema([("text", pa.string())])) as writer:
            for start in range(0, len(texts), 23):
                writer.write_table(pa.table({"text": texts[start : start + 23]}))
    files = resolve_sources(str(path))
    (file,), (filesystem,) = files.files, files.filesystems
    blocks = [b.to_pylist() for b in read_file_blocks(filesystem, file, TextRows(["text"]), 10)]
    assert len(blocks) == 10 and all(len(b) == 10 for b in blocks[:-1]) and len(blocks[-1]) == 5
    rows = [row for block in blocks for row in block]
    assert [row["_row_id"] & ((1 << 36) - 1) for row in rows] == list(range(1, 96))
    assert [row["text"] for row in rows if not row["_drop"]] == [t for t in texts if t]


def _complete_lines_inflated(data: bytes) -> int:
    """Lines that Python's own zlib gets whole out of a (cut) gzip file: the most any reader
    can claim to have read before it fails."""
    inflated = zlib.decompressobj(wbits=31).decompress(data)
    return inflated.count(b"\n")


def test_a_gzip_cut_in_half_is_named_with_the_line_it_reached(tmp_path):
    lines = [json.dumps({"text": f"sentence number {n} of a long corpus"}) for n in range(80_000)]
    whole = gzip.compress("\n".join(lines).encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CorpusError) as caught:
        read_rows(str(path))
    message = str(caught.value)
    found = re.fullmatch(
        rf"{re.escape(str(path))}: failed to inflate gzip after line (\d+): (.+)", message
    )
    assert found, message
    assert 0 < int(found.group(1)) <= _complete_lines_inflated(path.read_bytes())
    assert "\n" not in message


def _zstd_garbage(path):
    if not pa.Codec.is_available("zstd"):
        pytest.skip("pyarrow built without zstd")
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"not a zstd frame at all " * 40)


@pytest.mark.parametrize(
    "name, write, codec",
    [
        ("garbage.txt.bz2", lambda p: p.write_bytes(b"BZh9" + b"bad bytes " * 50), "bz2"),
        ("garbage.jsonl.zst", _zstd_garbage, "zstd"),
        ("garbage.jsonl.gz", lambda p: p.write_bytes(b"\x1f\x8b\x08\x00" + b"\xff" * 300), "gzip"),
        (
            "cut.parquet.gz",
            lambda p: p.write_bytes(gzip.compress(random.Random(0).randbytes(20_000))[:9_000]),
            "gzip",
        ),
    ],
)
def test_a_corrupt_compressed_file_is_named_and_said_not_to_inflate(tmp_path, name, write, codec):
    path = tmp_path / name
    write(path)
    with pytest.raises(CorpusError) as caught:
        read_rows(str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: failed to inflate {codec}: "), message
    assert "\n" not in message


@pytest.mark.parametrize("suffix", ["parquet", "arrow"])
def test_a_table_file_that_is_text_is_named(tmp_path, suffix):
    path = tmp_path / f"notes.{suffix}"
    path.write_text("these are notes, not a table\n")
    with pytest.raises(
        CorpusError, match=rf"^{re.escape(str(path))}: not a readable {suffix} file"
    ):
        read_rows(str(path))
