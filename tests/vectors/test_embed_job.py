"""jobs/embed.py on the shipped sentences with a tiny random BERT: every kept row of the reader
in exactly one shard, with the vectors the in-process Embedder gives, for 1 and 2 actors and
after an actor is killed; a rerun embeds only the missing shards; int8 ranges are saved and
reused; the layout line; bfloat16 (embed.compute_dtype) checked and recorded per block and in
the manifest; embed.backend=onnx_int8 writes OnnxEmbedder's vectors of the exported
graph, records its agreement, and search embeds its queries through it; a graph failing the
check is refused; bad input is one line naming the key, before Ray starts."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from harness.jobs import checked_config, run

from distributed_emb.data.corpus import text_rules
from distributed_emb.data.data_config import DataConfig
from distributed_emb.data.readers import DROP, ROW_ID, iter_parsed_blocks
from distributed_emb.data.sources import resolve_sources
from distributed_emb.paths import shipped_corpus
from distributed_emb.scoring import pair_cosines

ROWS = 240  # data.max_rows of most runs: 6 blocks of 40 lines (the first lines are all kept)
BLOCK_ROWS = 40
INT8_ROWS = 2 * BLOCK_ROWS  # the embed.backend=onnx_int8 run: 2 blocks


def reader_rows(limit: int) -> tuple[np.ndarray, list[str]]:
    """The first `limit` kept rows of the shipped sentences as the training job's reader gives
    them: (row ids, texts), in corpus order."""
    ids, texts = [], []
    rules = text_rules(DataConfig())
    for block in iter_parsed_blocks(resolve_sources(shipped_corpus("wiki_sentences.txt")), rules):
        kept = block.filter(pc.equal(block.column(DROP), ""))
        ids += kept.column(ROW_ID).to_pylist()
        texts += kept.column("text").to_pylist()
        if len(ids) >= limit:
            break
    return np.asarray(ids[:limit], dtype=np.int64), texts[:limit]


def job_args(out: Path, model: str, *extra: str, rows: int = ROWS) -> list[str]:
    return [
        "--output",
        str(out),
        f"model.path={model}",
        f"data.max_rows={rows}",
        f"embed.block_rows={BLOCK_ROWS}",
        "embed.batch_size=16",
        "embed.num_cpus_per_actor=0.5",
        # The default (auto) is bfloat16 on a CPU with AMX: these runs are compared with the
        # float32 in-process embedder to 1e-5. bfloat16 in the job: the tests at the end.
        "embed.compute_dtype=float32",
        *extra,
    ]


def embed(out: Path, model: str, *extra: str, rows: int = ROWS):
    """The job's pass on the running Ray, from the config its command line gives."""
    from distributed_emb.vectors.corpus_embedding import embed_corpus

    return embed_corpus(checked_config("embed", job_args(out, model, *extra, rows=rows)))


def read_output(out: Path) -> tuple[np.ndarray, np.ndarray, list[str], dict]:
    """(ids, embeddings, texts, manifest) of every shard the manifest lists, in its order."""
    manifest = json.loads((out / "manifest.json").read_text())
    tables = [pq.read_table(out / entry["file"]) for entry in manifest["shards"]]
    ids = np.concatenate([t.column("id").to_numpy() for t in tables])
    vectors = np.concatenate(
        [np.stack(t.column("embedding").to_numpy(zero_copy_only=False)) for t in tables]
    )
    texts = [text for t in tables for text in t.column("text").to_pylist()]
    return ids, vectors, texts, manifest


@pytest.fixture(scope="module")
def embedder(tiny_bert_path):
    """The in-process reference: the tiny BERT as the job loads a plain HF directory (mean)."""
    from distributed_emb.model.embedder import Embedder

    return Embedder(tiny_bert_path, pooler="mean", batch_size=16)


@pytest.fixture(scope="module")
def one_actor_output(tiny_bert_path, tmp_path_factory):
    """One run of the job as a user starts it (jobs/embed.py, one actor, --index): (OUT,
    stdout)."""
    from harness import local_ray

    local_ray.start_shared_ray()
    out = tmp_path_factory.mktemp("embedded") / "out"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert run("embed", job_args(out, tiny_bert_path, "embed.concurrency=1", "--index")) == 0
    return out, printed.getvalue()


@pytest.fixture(scope="module")
def two_actor_binary_output(tiny_bert_path, tmp_path_factory):
    """One run with two actors, vectors stored as bits (ubinary): OUT."""
    from harness import local_ray

    local_ray.start_shared_ray()
    out = tmp_path_factory.mktemp("embedded_binary") / "out"
    embed(out, tiny_bert_path, "embed.concurrency=2", "embed.precision=ubinary")
    return out


@pytest.fixture(scope="module")
def int8_backend_output(tiny_bert_path, tmp_path_factory):
    """One run through the int8 ONNX graph (embed.backend=onnx_int8), the layout the job
    chooses, 2 blocks: (OUT, stdout). The graph is exported into OUT/graphs/ by this run."""
    from harness import local_ray

    local_ray.start_shared_ray()
    out = tmp_path_factory.mktemp("embedded_int8") / "out"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        args = job_args(out, tiny_bert_path, "embed.backend=onnx_int8", rows=INT8_ROWS)
        assert run("embed", args) == 0
    return out, printed.getvalue()


@pytest.mark.ray
@pytest.mark.parametrize("actors", [1, 2])
def test_every_kept_row_in_exactly_one_shard(
    actors, one_actor_output, two_actor_binary_output, ray_local
):
    out = one_actor_output[0] if actors == 1 else two_actor_binary_output
    ids, _, texts, manifest = read_output(out)
    expected_ids, expected_texts = reader_rows(ROWS)
    assert np.array_equal(ids, expected_ids)  # each kept row once, in corpus order
    assert texts == expected_texts
    assert manifest["rows"] == ROWS and manifest["dim"] == 32
    assert [s["first_id"] for s in manifest["shards"]] == list(range(1, ROWS, BLOCK_ROWS))
    assert all(s["rows"] == BLOCK_ROWS for s in manifest["shards"])
    for entry in manifest["shards"]:  # named by the block's first id; ids sorted inside
        shard_ids = pq.read_table(out / entry["file"], columns=["id"]).column("id").to_numpy()
        assert shard_ids[0] == entry["first_id"] and np.all(np.diff(shard_ids) > 0)


@pytest.mark.ray
def test_vectors_are_the_in_process_embedder_s(one_actor_output, embedder, ray_local):
    out, printed = one_actor_output
    _, vectors, texts, manifest = read_output(out)
    np.testing.assert_allclose(vectors, embedder.embed(texts), atol=1e-5)
    assert manifest["dtype"] == "float32" and manifest["normalized"] is False  # mean, no Normalize
    assert "6 shards written, 0 skipped" in printed and "kept 240" in printed
    assert (manifest["backend"], manifest["graph"], manifest["agreement"]) == ("torch", None, None)
    # The layout, in one line: embed.concurrency=1 as set, its threads the node's cores.
    (line,) = [x for x in printed.splitlines() if x.startswith("layout: ")]
    assert "1 actor × " in line and "torch thread" in line and "embed.concurrency" in line


@pytest.mark.ray
def test_int8_backend_writes_the_onnx_embedder_s_vectors(int8_backend_output, ray_local):
    """Each shard holds what OnnxEmbedder gives for its block's texts on the exported int8
    graph (a block embedded whole, its batches as the actor cuts them), rows in id order."""
    from distributed_emb.model.onnx_embedder import OnnxEmbedder

    out, printed = int8_backend_output
    ids, _, _, manifest = read_output(out)
    assert np.array_equal(ids, reader_rows(INT8_ROWS)[0])
    graph = out / manifest["graph"]  # exported into OUT/graphs/ by the run
    assert manifest["graph"].startswith("graphs/")
    assert (graph / "onnx" / "model_qint8.onnx").is_file()
    reference = OnnxEmbedder(graph, "int8", batch_size=16)
    for entry in manifest["shards"]:
        shard = pq.read_table(out / entry["file"])
        stored = np.stack(shard.column("embedding").to_numpy(zero_copy_only=False))
        expected = reference.embed(shard.column("text").to_pylist(), role="document")
        np.testing.assert_allclose(stored, expected, atol=1e-5)
    (line,) = [x for x in printed.splitlines() if x.startswith("layout: ")]
    assert "onnxruntime thread" in line and "(onnx_int8;" in line


@pytest.mark.ray
def test_the_manifest_records_the_backend_and_its_agreement(int8_backend_output, ray_local):
    out, _ = int8_backend_output
    manifest = json.loads((out / "manifest.json").read_text())
    export = json.loads((out / manifest["graph"] / "onnx" / "export.json").read_text())
    checked = export["backends"]["onnx_int8"]  # the export's own check, on STS-B dev
    agreement = manifest["agreement"]
    assert manifest["backend"] == "onnx_int8" and agreement["variant"] == "int8"
    assert agreement["cosine_to_torch_mean"] == pytest.approx(checked["cosine_to_torch_mean"])
    assert agreement["cosine_to_torch_min"] == pytest.approx(checked["cosine_to_torch_min"])
    assert agreement["sentences"] == checked["sentences"] > 1000  # all of STS-B dev
    assert agreement["cosine_to_torch_mean"] >= agreement["min_mean_cosine"] == 0.97
    assert agreement["checked_on"] == "STS-B dev" and export["check_passed"]
    settings = json.loads((out / "embedding_settings.json").read_text())
    assert settings["backend"] == "onnx_int8"


@pytest.mark.ray
def test_search_embeds_queries_through_the_manifest_s_graph(int8_backend_output, tmp_path):
    """A row's own text as the query finds it with cosine 1: the query went through the same
    int8 graph (the torch model's vector of it differs; another backend is refused:
    test_search.py)."""
    out, _ = int8_backend_output
    _, _, texts, _ = read_output(out)
    results = tmp_path / "results.jsonl"
    status = run(
        "search", [str(out), "--exact", "--query", texts[7], "-k", "1", "--output", str(results)]
    )
    assert status == 0
    (hit,) = json.loads(results.read_text())["results"]
    assert hit["text"] == texts[7] and hit["score"] == pytest.approx(1.0, abs=1e-5)


def test_a_graph_failing_the_agreement_check_is_refused_naming_the_figure(tmp_path):
    """A cached export whose check recorded a mean cosine below the minimum: refused before any
    actor starts, with the figure (no model is loaded: the export is there)."""
    from distributed_emb.model.onnx_files import EXPORTER
    from distributed_emb.vectors.embed_backend import BackendCheckError, graph_key, prepare_graph

    figures = {"sentences": 2910, "stsb_dev_spearman": 80.0}
    cache = tmp_path / "graphs" / graph_key("digest", "/models/m", "mean") / "onnx"
    cache.mkdir(parents=True)
    (cache / "export.json").write_text(
        json.dumps(
            {
                "exporter": EXPORTER,
                "variants": {"fp32": {"file": "model.onnx"}, "int8": {"file": "model_qint8.onnx"}},
                "backends": {
                    "torch": {"stsb_dev_spearman": 82.0, "pairs": 1500},
                    "onnx_fp32": {
                        **figures,
                        "cosine_to_torch_mean": 1.0,
                        "cosine_to_torch_min": 1.0,
                    },
                    "onnx_int8": {
                        **figures,
                        "cosine_to_torch_mean": 0.912,
                        "cosine_to_torch_min": 0.5,
                    },
                },
            }
        )
    )
    with pytest.raises(BackendCheckError, match=r"int8 graph's mean cosine .* is 0\.9120 .* 0\.97"):
        prepare_graph("onnx_int8", "/models/m", "digest", "mean", str(tmp_path / "graphs"))
    graph = prepare_graph("onnx", "/models/m", "digest", "mean", str(tmp_path / "graphs"))
    assert graph.source == "cache" and graph.agreement["cosine_to_torch_mean"] == 1.0


@pytest.mark.ray
def test_a_block_s_batches_go_longest_first(int8_backend_output, tiny_bert_path, ray_local):
    """The actors embed a block's texts in one call, and both backends cut its batches longest
    first: the torch model by characters (SentenceTransformer.encode's sort), the graph by
    token count (OnnxEmbedder), so each batch pads little."""
    from distributed_emb.model.embedder import Embedder
    from distributed_emb.vectors.embed_backend import GraphEmbedder

    out, _ = int8_backend_output
    _, _, texts, manifest = read_output(out)
    graph = GraphEmbedder(str(out / manifest["graph"]), "int8", batch_size=8)
    torch_model = Embedder(tiny_bert_path, pooler="mean", batch_size=8)
    widths: dict[str, list[int]] = {"graph": [], "torch": []}
    run_graph = graph.graph.session.run
    graph.graph.session.run = lambda names, feed: (
        widths["graph"].append(feed["input_ids"].shape[1]) or run_graph(names, feed)
    )
    forward = torch_model.model.forward
    torch_model.model.forward = lambda features, **kw: (
        widths["torch"].append(features["input_ids"].shape[1]) or forward(features, **kw)
    )
    block = texts[:BLOCK_ROWS]
    graph.embed(block, role="document")
    torch_model.embed(block, role="document")

    tokens = [
        len(ids) for ids in graph.graph.tokenizer(block, graph.graph.max_seq_length)["input_ids"]
    ]
    by_characters = np.argsort([-len(t) for t in block], kind="stable")
    assert widths["torch"] == [
        max(tokens[i] for i in by_characters[start : start + 8]) for start in range(0, 40, 8)
    ]
    assert widths["graph"] == sorted(tokens, reverse=True)[::8]  # each batch's longest
    unsorted = sum(max(tokens[start : start + 8]) for start in range(0, 40, 8))
    assert sum(widths["graph"]) <= sum(widths["torch"]) < unsorted


@pytest.mark.ray
def test_ubinary_packs_one_bit_per_dimension(two_actor_binary_output, embedder, ray_local):
    _, stored, texts, manifest = read_output(two_actor_binary_output)
    assert manifest["dtype"] == "ubinary"
    assert stored.dtype == np.uint8 and stored.shape == (ROWS, 4)  # 32 dimensions, 8 a byte
    signs = embedder.embed(texts) > 0
    # Bits of values within float noise of 0 may differ from the in-process run's.
    assert (np.unpackbits(stored, axis=1).astype(bool) == signs).mean() > 0.999


@pytest.mark.ray
def test_rerun_embeds_only_the_missing_shard(one_actor_output, tiny_bert_path, ray_local, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(one_actor_output[0], out)
    shards = sorted((out / "shards").glob("part-*.parquet"))
    removed = shards[2]
    before = {p.name: p.stat().st_mtime_ns for p in shards if p != removed}
    original = pq.read_table(removed)
    removed.unlink()

    result = embed(out, tiny_bert_path, "embed.concurrency=1")

    assert (result.shards_written, result.shards_skipped) == (1, 5)
    assert result.rows_embedded == BLOCK_ROWS and result.rows == ROWS
    # The finished shards were not written again; the missing one is back, the same.
    assert {p.name: p.stat().st_mtime_ns for p in shards if p != removed} == before
    again = pq.read_table(removed)
    assert again.column("id").equals(original.column("id"))
    np.testing.assert_allclose(
        np.stack(again.column("embedding").to_numpy(zero_copy_only=False)),
        np.stack(original.column("embedding").to_numpy(zero_copy_only=False)),
        atol=1e-5,
    )
    assert read_output(out)[0].tolist() == reader_rows(ROWS)[0].tolist()


def _kill_the_encoding_actor_mid_run(shards: Path, killed: list[tuple[int, int]]) -> None:
    """Once the first shard is written, SIGKILL the encoding actor of this test's run (found by
    its class in the test's Ray) and record (its pid, shards written by then)."""
    from ray._private import state  # the GCS actor table: no dashboard needed

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        done = len(list(shards.glob("part-*.parquet"))) if shards.is_dir() else 0
        if done:
            for actor in state.actors().values():
                name = actor.get("ActorClassName") or ""
                if "ShardEmbedder" in name and actor.get("State") == "ALIVE" and actor.get("Pid"):
                    os.kill(actor["Pid"], signal.SIGKILL)
                    killed.append((actor["Pid"], done))
                    return
        time.sleep(0.005)


@pytest.mark.ray
def test_a_killed_actor_is_restarted_and_its_blocks_redone(tiny_bert_path, ray_local, tmp_path):
    rows, block_rows = 1000, 10  # 100 blocks: the kill lands while most are still to do
    out = tmp_path / "out"
    killed: list[tuple[int, int]] = []
    killer = threading.Thread(
        target=_kill_the_encoding_actor_mid_run, args=(out / "shards", killed), daemon=True
    )
    killer.start()
    result = embed(
        out, tiny_bert_path, "embed.concurrency=1", f"embed.block_rows={block_rows}", rows=rows
    )
    killer.join(timeout=5)

    assert len(killed) == 1, "the encoding actor was never found and killed"
    assert killed[0][1] < rows // block_rows, "the run had finished before the kill"
    ids = read_output(out)[0]
    assert np.array_equal(ids, reader_rows(rows)[0])  # every id, exactly once
    assert result.shards_written == rows // block_rows
    assert not [p for p in (out / "shards").iterdir() if p.name.startswith(".")]  # no leftovers


@pytest.mark.ray
def test_int8_ranges_are_saved_and_reused(tiny_bert_path, embedder, ray_local, tmp_path):
    from sentence_transformers import quantize_embeddings

    out = tmp_path / "out"
    embed(out, tiny_bert_path, "embed.precision=int8", "embed.calibration_rows=100", rows=80)
    ranges = np.load(out / "calibration.npy")
    _, sample = reader_rows(100)
    reference = embedder.embed(sample[:80])  # max_rows 80 < calibration_rows: these 80
    np.testing.assert_allclose(ranges, [reference.min(0), reference.max(0)], atol=1e-5)
    ids, stored, texts, manifest = read_output(out)
    assert manifest["dtype"] == "int8" and manifest["calibration"] == "calibration.npy"
    assert stored.dtype == np.int8 and stored.shape == (80, 32)
    expected = quantize_embeddings(embedder.embed(texts), precision="int8", ranges=ranges)
    assert np.abs(stored.astype(int) - expected).max() <= 1  # a bucket edge at float noise
    assert (stored == expected).mean() > 0.99

    # A rerun quantises with the saved ranges, not new ones: changed on disk, they show.
    wider = np.stack([ranges[0] - 1.0, ranges[1] + 1.0]).astype(np.float32)
    np.save(out / "calibration.npy", wider)
    (out / "shards" / "part-000000000041.parquet").unlink()
    embed(out, tiny_bert_path, "embed.precision=int8", "embed.calibration_rows=100", rows=80)
    redone = pq.read_table(out / "shards" / "part-000000000041.parquet")
    values = np.stack(redone.column("embedding").to_numpy(zero_copy_only=False))
    texts = redone.column("text").to_pylist()
    expected = quantize_embeddings(embedder.embed(texts), precision="int8", ranges=wider)
    assert np.abs(values.astype(int) - expected).max() <= 1


# ---------------------------------------------------------------------------------------------
# Refused before Ray starts: one line on stderr naming the key, exit status 2
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("model.path=/no/such/model", "model.path"),
        ("data.path=/no/such/corpus.txt", "/no/such/corpus.txt"),
        ("data.kind=pairs", "data.kind"),
        ("embed.precision=int4", "embed.precision"),
    ],
)
def test_bad_input_is_named_before_ray(override, named, tmp_path, capsys, monkeypatch):
    from distributed_emb import cli

    monkeypatch.setattr(cli, "start_ray", lambda *a, **k: pytest.fail("the job started Ray"))
    assert run("embed", ["--output", str(tmp_path / "out"), override]) == 2
    error = capsys.readouterr().err
    assert named in error and len(error.strip().splitlines()) == 1


def test_no_output_is_named(capsys):
    assert run("embed", []) == 2
    assert "embed.output_dir: is required" in capsys.readouterr().err


@pytest.mark.ray
@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("embed.block_rows=50", "embed.block_rows=40"),
        ("embed.precision=int8", "embed.precision=float32"),
        ("embed.backend=onnx_int8", "embed.backend=torch"),
        ("embed.compute_dtype=bfloat16", "embed.compute_dtype=float32"),
        (f"data.path={shipped_corpus('lee_documents.jsonl')}", "data.path:"),
    ],
)
def test_an_output_made_otherwise_is_refused(
    override, named, one_actor_output, tiny_bert_path, ray_local, tmp_path, capsys
):
    out = tmp_path / "out"
    shutil.copytree(one_actor_output[0], out)
    assert run("embed", [*job_args(out, tiny_bert_path), override]) == 2
    error = capsys.readouterr().err
    assert named in error and str(out) in error


@pytest.mark.ray
def test_another_model_in_the_same_output_is_refused(
    one_actor_output, tiny_bert_path, minilm_path, ray_local, tmp_path, capsys
):
    out = tmp_path / "out"
    shutil.copytree(one_actor_output[0], out)
    assert run("embed", job_args(out, minilm_path)) == 2
    assert "model.path: " in capsys.readouterr().err
    # The same directory with other weights: another model too.
    retrained = tmp_path / "model"
    shutil.copytree(tiny_bert_path, retrained)
    other = tmp_path / "other"
    shutil.copytree(one_actor_output[0], other)
    settings = json.loads((other / "embedding_settings.json").read_text())
    settings["model"] = str(retrained)
    (other / "embedding_settings.json").write_text(json.dumps(settings))
    config = json.loads((retrained / "config.json").read_text())
    (retrained / "config.json").write_text(json.dumps({**config, "initializer_range": 0.5}))
    assert run("embed", job_args(other, str(retrained))) == 2
    assert "has changed since" in capsys.readouterr().err


def test_the_index_flag_indexes_every_shard_and_reports_its_recall(one_actor_output):
    """--index: one index file per shard the manifest lists, index.json, and the recall@10
    against exact search printed (flat indexes below index.flat_below_rows: every neighbour)."""
    out, printed = one_actor_output
    manifest = json.loads((out / "manifest.json").read_text())
    info = json.loads((out / "index" / "index.json").read_text())
    assert len(info["shards"]) == len(manifest["shards"])
    assert all((out / s["file"]).is_file() for s in info["shards"])
    (line,) = [x for x in printed.splitlines() if "recall@10 against exact search" in x]
    assert float(line.rsplit(" ", 1)[1]) >= 0.95


# ---------------------------------------------------------------------------------------------
# embed.compute_dtype: the actor's number format, its check and what the manifest says
# ---------------------------------------------------------------------------------------------


def _block_table(first_id: int, texts: list[str]):
    """One block row as the reading side hands it to an encoding actor."""
    import pyarrow as pa

    from distributed_emb.vectors import corpus_embedding as ce

    return pa.table(
        {
            ce.BLOCK: pa.array([first_id], pa.int64()),
            ce.ROWS: pa.array([len(texts)], pa.int64()),
            ce.IDS: pa.array([list(range(first_id, first_id + len(texts)))], pa.list_(pa.int64())),
            ce.TEXTS: pa.array([texts], pa.list_(pa.string())),
            ce.EMBED: pa.array([True], pa.bool_()),
        }
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_an_actor_records_its_number_format_and_bfloat16_s_check(
    dtype, tiny_bert_path, embedder, tmp_path
):
    """The encoding actor's class in process (no Ray): its shard's vectors, the summary row's
    computed_in and precision_check, and the manifest's fields folded from those rows."""
    from distributed_emb.model.compute_dtype import CHECK_ROWS
    from distributed_emb.vectors import corpus_embedding as ce

    _, texts = reader_rows(BLOCK_ROWS)
    actor = ce.ShardEmbedder(
        str(tmp_path), "float32", None, True,
        model_path=tiny_bert_path, pooler="mean", batch_size=16, compute_dtype=dtype,
        embed_as="document",
    )  # fmt: skip
    (summary,) = actor(_block_table(1, texts)).to_pylist()
    shard = pq.read_table(tmp_path / "shards" / "part-000000000001.parquet")
    vectors = np.stack(shard.column("embedding").to_numpy(zero_copy_only=False))
    exact = embedder.embed(texts)
    cosines = pair_cosines(vectors, exact)
    assert summary[ce.COMPUTED_IN] == dtype
    folded = ce._precision({1: summary})
    assert folded["compute_dtype"] == [dtype]
    if dtype == "float32":
        np.testing.assert_allclose(vectors, exact, atol=1e-5)
        assert summary[ce.PRECISION_CHECK] is None and folded["precision_check"] is None
        return
    assert not np.allclose(vectors, exact, atol=1e-6)  # bfloat16 did run
    assert cosines.min() > 0.99
    check = json.loads(summary[ce.PRECISION_CHECK])
    assert check == folded["precision_check"] and check["rows"] == CHECK_ROWS
    # The check's figures are those of the first CHECK_ROWS texts, embedded both ways.
    assert check["worst_cosine"] == pytest.approx(cosines[:CHECK_ROWS].min(), abs=1e-3)


def test_bfloat16_failing_its_check_falls_back_under_auto_and_is_refused_when_asked(
    tiny_bert_path, embedder, monkeypatch
):
    from distributed_emb.model import compute_dtype
    from distributed_emb.model.embedder import Embedder

    _, texts = reader_rows(BLOCK_ROWS)
    monkeypatch.setattr(compute_dtype, "MIN_MEAN_COSINE", 1.01)  # no bfloat16 passes
    monkeypatch.setattr(compute_dtype, "cpu_has_bfloat16_matrices", lambda: True)
    auto = Embedder(tiny_bert_path, pooler="mean", batch_size=16, compute_dtype="auto")
    assert auto.compute_dtype == "bfloat16"  # auto's choice on an AMX CPU, before the check
    np.testing.assert_allclose(auto.embed(texts), embedder.embed(texts), atol=1e-5)
    assert auto.compute_dtype == "float32" and not auto.precision_check.passed
    asked = Embedder(tiny_bert_path, pooler="mean", batch_size=16, compute_dtype="bfloat16")
    with pytest.raises(
        compute_dtype.PrecisionCheckError,
        match=r"mean cosine of [01]\.\d{5} with float32.s, below the check.s 1\.01",
    ):
        asked.embed(texts)


def test_auto_is_float32_without_amx_and_on_gpus(monkeypatch):
    from distributed_emb.model import compute_dtype

    monkeypatch.setattr(compute_dtype, "cpu_has_bfloat16_matrices", lambda: False)
    assert compute_dtype.resolve_compute_dtype("auto", "cpu") == "float32"
    monkeypatch.setattr(compute_dtype, "cpu_has_bfloat16_matrices", lambda: True)
    assert compute_dtype.resolve_compute_dtype("auto", "cpu") == "bfloat16"
    assert compute_dtype.resolve_compute_dtype("auto", "cuda:0") == "float32"
    assert compute_dtype.resolve_compute_dtype("float32", "cpu") == "float32"


def test_the_job_prints_what_the_manifest_says_it_computed_in():
    import importlib

    embed_job = importlib.import_module("jobs.embed")
    check = {"rows": 32, "mean_cosine": 0.999984, "worst_cosine": 0.99997, "min_mean_cosine": 0.999}
    line = embed_job.computed_in_line({"compute_dtype": ["bfloat16"], "precision_check": check})
    assert line == (
        "computed in bfloat16 (bfloat16 against float32 on 32 texts: mean cosine 0.99998, "
        "worst 0.99997)"
    )
    assert embed_job.computed_in_line({"compute_dtype": ["float32"]}) == "computed in float32"


def test_bfloat16_with_an_onnx_backend_is_refused_before_ray(tmp_path, capsys):
    args = ["--output", str(tmp_path / "out"), "embed.backend=onnx", "embed.compute_dtype=bfloat16"]
    assert run("embed", args) == 2
    assert "embed.compute_dtype" in capsys.readouterr().err
