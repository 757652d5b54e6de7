"""The whole MCR² run on a tiny BERT and tiny data: table, JSON, exported models, job CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from harness.tiny_run import tiny_beir_dir

from distributed_emb.config import load_config
from distributed_emb.evaluation.senteval_data import STS_YEAR_SUBSETS
from distributed_emb.mcr2.compression_config import MCR2Config
from distributed_emb.mcr2.pipeline import torch_threads
from distributed_emb.paths import shipped_corpus, shipped_senteval_dir
from distributed_emb.plots import write_panels

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> tuple[str, str, str]:
    """A SentEval dir with the first 80 rows of each STS-B split, 6 short documents, and a
    second SentEval dir holding only an STS12 made of STS-B test rows 80–129 (10 per subset)."""
    root = tmp_path_factory.mktemp("mcr2_data")
    stsb = root / "senteval" / "STS" / "STSBenchmark"
    stsb.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        source = Path(shipped_senteval_dir()) / "STS" / "STSBenchmark" / f"sts-{split}.csv"
        lines = source.read_text(encoding="utf-8").splitlines(keepends=True)[:80]
        (stsb / f"sts-{split}.csv").write_text("".join(lines), encoding="utf-8")
    sts12 = root / "more" / "STS" / "STS12-en-test"
    sts12.mkdir(parents=True)
    test_rows = (
        (Path(shipped_senteval_dir()) / "STS" / "STSBenchmark" / "sts-test.csv")
        .read_text(encoding="utf-8")
        .splitlines()[80:130]
    )
    for i, subset in enumerate(STS_YEAR_SUBSETS["STS12"]):
        fields = [row.split("\t") for row in test_rows[10 * i : 10 * i + 10]]
        (sts12 / f"STS.input.{subset}.txt").write_text("".join(f"{f[5]}\t{f[6]}\n" for f in fields))
        (sts12 / f"STS.gs.{subset}.txt").write_text("".join(f"{f[4]}\n" for f in fields))
    documents = root / "documents.jsonl"
    with open(shipped_corpus("wiki_documents.jsonl"), encoding="utf-8") as source:
        rows = [json.loads(line) for line in source][:6]
    documents.write_text(
        "".join(json.dumps({**r, "sentences": r["sentences"][:10]}) + "\n" for r in rows)
    )
    return str(root / "senteval"), str(documents), str(root / "more")


def _overrides(tmp_path, tiny_bert_path, small_data) -> list[str]:
    senteval_dir, documents, _ = small_data
    return [
        f"output.dir={tmp_path / 'run'}",
        f"model.path={tiny_bert_path}",
        "model.use_ray=false",
        f"model.cache_dir={tmp_path / 'cache'}",
        "model.max_seq_length=32",
        f"sentences.paths=[{documents}]",
        f"pairs.senteval_dir={senteval_dir}",
        "pairs.min_score=3.0",
        f"eval.senteval_dir={senteval_dir}",
        "output_dims=[4, 8]",
        "head.hidden_dims=[16]",
        "train.epochs=2",
        "train.batch_size=32",
        "train.pair_batch_size=8",
    ]


def test_run_trains_compares_and_exports(tmp_path, tiny_bert_path, small_data, monkeypatch):
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer

    from distributed_emb.evaluation.senteval_data import read_sts_benchmark, read_sts_year
    from distributed_emb.evaluation.sts import spearman_of_embeddings
    from distributed_emb.mcr2 import pipeline
    from distributed_emb.model.embedder import local_encode
    from distributed_emb.tracking import read_train_log

    plotted = []

    def record_plot(panels, path, title=None):
        plotted.append(panels)
        return write_panels(panels, path, title)

    monkeypatch.setattr(pipeline, "write_panels", record_plot)
    overrides = _overrides(tmp_path, tiny_bert_path, small_data)
    beir = tiny_beir_dir(tmp_path / "beir")  # dev, test and train splits; train not scored
    config = load_config(
        MCR2Config,
        None,
        [
            *overrides,
            f"eval.extra_senteval_dirs=[{small_data[2]}]",
            f"eval.retrieval_dir={beir}",
            "eval.retrieval_splits=[dev, test]",
            "eval.select_by=retrieval:dev",  # the heads' epochs chosen on the BEIR dev split
            "heldout.seed=5",  # of the 6 documents: wiki-290 held out as dev, wiki-39 as test
            f"output.storage_path={tmp_path / 'storage'}",  # a shared path: as s3:// would
        ],
    )
    config.validate()
    results = pipeline.run(config)

    methods = [(row["dim"], row["method"]) for row in results["table"]]
    assert methods == [
        (4, "mcr2"), (4, "pca"), (4, "pca_whiten"), (4, "random"),
        (8, "mcr2"), (8, "pca"), (8, "pca_whiten"), (8, "random"), (32, "full"),
    ]  # fmt: skip
    assert "pairs from IDC" in results["training"]["pairs"]  # the label-free default
    rows = {(row["dim"], row["method"]): row for row in results["table"]}
    training = results["training"]
    assert training["select_by"] == "retrieval:dev"
    assert training["selected_on"] == "nDCG@10 on retrieval dev"
    for dim in (4, 8):
        head = training["heads"][dim]
        assert rows[(dim, "mcr2")]["stsb_dev"] == pytest.approx(head["best_stsb_dev"])
        # Each head's epoch is its best on the dev split's nDCG@10 (the earlier on a tie),
        # the same number the table reports for the kept head.
        ndcg = [row["retrieval_dev_ndcg_at_10"] for row in head["history"]]
        assert head["best_epoch"] == int(np.argmax(ndcg))
        assert head["best_select_score"] == max(ndcg)
        assert rows[(dim, "mcr2")]["retrieval_dev_ndcg_at_10"] == pytest.approx(max(ndcg))
    # STS-B from the first dir, STS12 from the second; no SICK-R, no transfer data. The unseen
    # average leaves STS-B (the selection domain) out.
    full = rows[(32, "full")]
    assert full["sts_tasks"] == ["STS12", "STSBenchmark"]
    assert full["sts_avg"] == pytest.approx((full["stsb_test"] + full["sts12_16"]) / 2)
    assert full["unseen_sts_avg"] == full["sts12_16"] and full["sickr_test"] is None
    assert full["transfer_avg"] is None and full["retrieval_mrr"] is not None
    # The BEIR splits asked for, in every row, as the suite scored them; never the third.
    beir_output = results["evaluation"]["full-32"]["beir"]
    assert list(beir_output) == ["dev", "test"] and full["beir_splits"] == ["dev", "test"]
    assert full["retrieval_test_ndcg_at_10"] == beir_output["test"]["metrics"]["ndcg@10"]
    assert all(row["retrieval_dev_ndcg_at_10"] is not None for row in results["table"])

    # The uncompressed row is the plain encoder scored by the project's STS function.
    test = read_sts_benchmark(small_data[0], "test")
    e1, e2 = (
        local_encode(s, tiny_bert_path, pooler="mean", max_seq_length=32)
        for s in (test.sentences1, test.sentences2)
    )
    assert full["stsb_test"] == pytest.approx(spearman_of_embeddings(e1, e2, test.scores), abs=1e-3)
    # STS12's subsets pooled, scored by hand on the same vectors.
    subsets = read_sts_year(small_data[2], "STS12")
    s1 = [s for x in subsets for s in x.sentences1]
    s2 = [s for x in subsets for s in x.sentences2]
    v1, v2 = (local_encode(s, tiny_bert_path, pooler="mean", max_seq_length=32) for s in (s1, s2))
    cosine = (v1 * v2).sum(1) / np.linalg.norm(v1, axis=1) / np.linalg.norm(v2, axis=1)
    gold = np.concatenate([x.scores for x in subsets])
    assert full["sts12_16"] == pytest.approx(100 * spearmanr(cosine, gold)[0], abs=1e-3)
    # Whitened PCA is PCA with each component scaled: the same rank order per component, but
    # different cosines; it is its own row.
    assert rows[(8, "pca_whiten")]["stsb_test"] != rows[(8, "pca")]["stsb_test"]
    # Each row against the uncompressed encoder on the same test pairs, with its interval.
    intervals = results["intervals"]
    assert intervals["reference"] == "full-32" and len(intervals["rows"]) == 8
    pca = next(r["intervals"] for r in intervals["rows"] if (r["dim"], r["method"]) == (8, "pca"))
    assert set(pca) == {
        "stsb_test", "STS12", "retrieval_mrr",
        "retrieval_dev_ndcg_at_10", "retrieval_test_ndcg_at_10", "documents_test_ndcg_at_10",
    }  # fmt: skip
    assert pca["retrieval_test_ndcg_at_10"]["n"] == 5  # tiny_beir_dir's test queries
    # Each head against PCA at its size, on the same per-query values.
    versus = {r["dim"]: r for r in intervals["versus_pca"]}
    assert [(r["method"], r["reference"]) for r in versus.values()] == [
        ("mcr2", "pca-4"), ("mcr2", "pca-8"),
    ]  # fmt: skip
    head_vs_pca = versus[8]["intervals"]["retrieval_dev_ndcg_at_10"]
    assert head_vs_pca["baseline"] == pytest.approx(rows[(8, "pca")]["retrieval_dev_ndcg_at_10"])
    assert head_vs_pca["candidate"] == pytest.approx(rows[(8, "mcr2")]["retrieval_dev_ndcg_at_10"])
    assert pca["stsb_test"]["baseline"] == pytest.approx(full["stsb_test"])
    assert pca["stsb_test"]["candidate"] == pytest.approx(rows[(8, "pca")]["stsb_test"])
    assert pca["STS12"]["n"] == 50 and pca["stsb_test"]["low"] <= pca["stsb_test"]["high"]

    out = Path(config.output.dir)
    # The corpus of end-to-end fine-tuning: exactly the heads' sentences and cluster ids.
    import pyarrow.parquet as pq

    from distributed_emb.mcr2.data import load_training_sentences

    sentences = load_training_sentences(config.sentences, config.heldout)
    table = pq.read_table(out / pipeline.TRAINING_SENTENCES_FILE).to_pydict()
    assert table["text"] == sentences.texts
    assert table["cluster_id"] == sentences.cluster_ids.tolist()
    # The held-out documents: in no training row, the run's yardstick, a column of every row
    # and, on test, an interval against the encoder.
    assert [row["doc_id"] for row in sentences.held_out] == ["wiki-39", "wiki-290"]
    assert not {s for row in sentences.held_out for s in row["sentences"]} & set(table["text"])
    assert results["training"]["documents_dir"] == str(out / pipeline.DOCUMENTS_EVAL_DIR)
    assert sorted(p.name for p in (out / "documents_eval" / "qrels").iterdir()) == [
        "dev.tsv", "test.tsv",
    ]  # fmt: skip
    documents_output = results["evaluation"]["full-32"]["documents"]
    assert full["documents_test_ndcg_at_10"] == documents_output["test"]["metrics"]["ndcg@10"]
    assert all(row["documents_dev_ndcg_at_10"] is not None for row in results["table"])
    assert pca["documents_test_ndcg_at_10"]["n"] == documents_output["test"]["n_queries"] == 4
    assert "held-out documents test nDCG@10" in (out / "results.md").read_text()
    written = json.loads((out / "results.json").read_text())
    assert len(written["table"]) == 9 and "| 4 | mcr2 |" in (out / "results.md").read_text()
    report = (out / "results.md").read_text()
    assert "Difference from full-32" in report and "Each head minus PCA" in report
    assert "epoch chosen by nDCG@10 on retrieval dev (`eval.select_by=retrieval:dev`)" in report
    assert written["training"]["select_by"] == "retrieval:dev"
    assert f"| {beir.name} test nDCG@10 |" in report
    assert written["intervals"]["reference"] == "full-32"
    # Storage holds every output, the logs and curves under logs/ as the driver uploaded them.
    stored = tmp_path / "storage" / "run"
    assert results["storage_uri"] == str(stored)
    assert json.loads((stored / "results.json").read_text())["table"] == written["table"]
    assert (stored / "results.md").read_text() == report
    assert {"heads_vs_baselines.png", "training_sentences.parquet"} <= set(
        p.name for p in stored.iterdir()
    )
    assert (stored / "models" / "mcr2-8" / "config_sentence_transformers.json").is_file()
    assert (stored / "logs" / "train_log.jsonl").read_text() == (
        out / "train_log.jsonl"
    ).read_text()
    assert any((stored / "logs" / "tensorboard").iterdir())
    assert "document-level yardstick" in (stored / "logs" / "run.log").read_text()
    model = SentenceTransformer(results["exported_models"][8], device="cpu")
    vectors = model.encode(test.sentences1[:5])
    assert vectors.shape == (5, 8)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)

    # The plot next to results.json: STS-B dev per size for each method, `full` as a reference
    # line, and each head's STS-B dev per epoch, all taken from the table and the histories.
    (panels,) = plotted
    dev = next(p for p in panels if p.title == "STS-B dev")
    assert dev.series == {
        m: [(d, rows[(d, m)]["stsb_dev"]) for d in (4, 8)]
        for m in ("mcr2", "pca", "pca_whiten", "random")
    }
    assert dev.references == {"full (32)": full["stsb_dev"]} and dev.xticks == [4, 8]
    assert "transfer avg" not in [p.title for p in panels]  # no transfer data: no chart
    epochs = panels[-1].series
    assert epochs["head 4"] == [
        (r["epoch"], r["stsb_dev"]) for r in results["training"]["heads"][4]["history"]
    ]
    assert (out / "heads_vs_baselines.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The sinks: every epoch of each head (step = epoch) and each table row (step = size).
    logged = read_train_log(out / "train_log.jsonl")
    head_4 = [r for r in logged if r["kind"] == "head_4"]
    assert [r["step"] for r in head_4] == [0, 1, 2]
    assert [r["stsb_dev"] for r in head_4] == [
        pytest.approx(r["stsb_dev"]) for r in results["training"]["heads"][4]["history"]
    ]
    pca = {r["step"]: r["stsb_dev"] for r in logged if r["kind"] == "pca"}
    assert pca == {4: pytest.approx(rows[(4, "pca")]["stsb_dev"]),
                   8: pytest.approx(rows[(8, "pca")]["stsb_dev"])}  # fmt: skip
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train.epochz=3"], "unknown config key 'train.epochz'"),
        (["output_dims=[64, 64]"], "output_dims: has duplicates"),
        (["loss.eps=0"], "loss.eps: must be > 0"),
        (["--senteval-data", "/no/such/dir"], "eval.senteval_dir: /no/such/dir is not a direct"),
        # A key from before the one vocabulary still works, and its error names the new key.
        (["optim.lr=0"], "train.learning_rate: must be > 0"),
        (["eval.select_by=ndcg"], "eval.select_by: 'ndcg' is not 'stsb_dev', retrieval:<split>"),
        (["eval.select_by=retrieval:test"], "eval.select_by: retrieval:test: test splits are"),
        (["eval.select_by=retrieval:train"], "eval.select_by: shipped:news/qrels has no train"),
        (
            ["eval.retrieval_dir=null", "eval.select_by=retrieval:dev"],
            "eval.select_by: retrieval:dev needs eval.retrieval_dir",
        ),
    ],
)
def test_job_rejects_bad_settings_before_doing_anything(argv, message, capsys):
    from harness.jobs import run

    assert run("train_mcr2", argv) == 2
    assert message in capsys.readouterr().err


def test_old_keys_move_to_the_one_vocabulary():
    config = load_config(MCR2Config, None, ["encoder.batch_size=7", "optim.lr=0.5", "output_dir=x"])
    assert config.model.batch_size == 7 and config.train.learning_rate == 0.5
    assert config.output.dir == "x"


def test_only_the_head_training_runs_on_train_torch_threads():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("a failing head still gives the threads back")
    assert torch.get_num_threads() == before


def test_heads_are_selected_on_sickr_dev_too_where_the_data_has_it(senteval_dir):
    """STS-B dev alone with the shipped data; STS-B dev and SICK-R dev (SICK_trial, 500
    pairs) with SentEval's."""
    from distributed_emb.mcr2 import pipeline
    from distributed_emb.paths import shipped_senteval_dir

    assert list(pipeline.read_dev_sets(shipped_senteval_dir())) == ["stsb_dev"]
    dev = pipeline.read_dev_sets(str(senteval_dir))
    assert list(dev) == ["stsb_dev", "sickr_dev"]
    assert len(dev["sickr_dev"].scores) == 500 and len(dev["stsb_dev"].scores) == 1500


def test_documents_dev_chooses_on_the_yardsticks_dev_split_at_the_passage_length(
    tmp_path, tiny_bert_path, small_data
):
    """eval.select_by=documents:dev: the split that chooses is the dev split of the yardstick
    the run wrote from its held-out documents, embedded by the passage encoder (the frozen
    encoder at eval.documents_max_seq_length, at most its position limit), under the key the
    table uses. No model runs: the encoders are stand-ins."""
    from distributed_emb.mcr2 import pipeline
    from distributed_emb.mcr2.embeddings import CachedEncoder

    overrides = _overrides(tmp_path, tiny_bert_path, small_data)
    config = load_config(MCR2Config, None, [*overrides, "eval.select_by=documents:dev",
                                            "heldout.seed=5"])  # fmt: skip
    inputs = pipeline.read_inputs(config)
    assert inputs.documents_dir == str(tmp_path / "run" / pipeline.DOCUMENTS_EVAL_DIR)
    split = inputs.retrieval_dev
    assert {q.split("#")[0] for q in split.query_ids} == {"wiki-290"}  # the dev document
    assert not set(split.corpus_texts) & set(inputs.sentences.texts)

    passages = pipeline.passage_encoder(config, tiny_bert_path)
    assert config.model.max_seq_length == 32 and passages.config.max_seq_length == 128

    def stand_in(value: float):
        return lambda texts: np.full((len(texts), 4), value, np.float32)

    sentences = CachedEncoder(config.model, encode=stand_in(1.0))
    passages = CachedEncoder(passages.config, encode=stand_in(2.0))
    chosen = pipeline.selection_set(config, inputs, sentences, passages)
    assert chosen.metric == "documents_dev_ndcg_at_10" and chosen.split is split
    assert np.all(chosen.vectors == 2.0)  # the passages' encoder, not the sentences'
    with pytest.raises(ValueError, match="needs the passage encoder"):
        pipeline.selection_set(config, inputs, sentences, None)

    # No held-out dev document (seed 0 holds out one test document): said before encoding.
    config.heldout.seed = 0
    with pytest.raises(ValueError, match=r"documents:dev: no held-out dev document has 2"):
        pipeline.read_inputs(config)
    assert sorted(p.name for p in (tmp_path / "run" / "documents_eval" / "qrels").iterdir()) == [
        "test.tsv"
    ]  # the previous yardstick's dev split did not outlive it
