"""The whole MCR² run on a tiny BERT and tiny data: table, JSON, exported models, job CLI."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from distributed_emb.config import load_config
from distributed_emb.mcr2.config import MCR2Config
from distributed_emb.paths import shipped_corpus, shipped_senteval_dir
from distributed_emb.tracking import write_panels

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> tuple[str, str]:
    """A SentEval dir with the first 80 rows of each STS-B split, and 6 short documents."""
    root = tmp_path_factory.mktemp("mcr2_data")
    stsb = root / "senteval" / "STS" / "STSBenchmark"
    stsb.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        source = Path(shipped_senteval_dir()) / "STS" / "STSBenchmark" / f"sts-{split}.csv"
        lines = source.read_text(encoding="utf-8").splitlines(keepends=True)[:80]
        (stsb / f"sts-{split}.csv").write_text("".join(lines), encoding="utf-8")
    documents = root / "documents.jsonl"
    with open(shipped_corpus("wiki_documents.jsonl"), encoding="utf-8") as source:
        rows = [json.loads(line) for line in source][:6]
    documents.write_text(
        "".join(json.dumps({**r, "sentences": r["sentences"][:10]}) + "\n" for r in rows)
    )
    return str(root / "senteval"), str(documents)


def _overrides(tmp_path, tiny_bert_path, small_data) -> list[str]:
    senteval_dir, documents = small_data
    return [
        f"output_dir={tmp_path / 'run'}",
        f"encoder.path={tiny_bert_path}",
        "encoder.use_ray=false",
        f"encoder.cache_dir={tmp_path / 'cache'}",
        "encoder.max_seq_length=32",
        f"sentences.paths=[{documents}]",
        f"pairs.senteval_dir={senteval_dir}",
        "pairs.min_score=3.0",
        f"eval.senteval_dir={senteval_dir}",
        "output_dims=[4, 8]",
        "head.hidden_dims=[16]",
        "optim.epochs=2",
        "optim.batch_size=32",
        "optim.pair_batch_size=8",
    ]


def test_run_trains_compares_and_exports(tmp_path, tiny_bert_path, small_data, monkeypatch):
    from sentence_transformers import SentenceTransformer

    from distributed_emb.evaluation.senteval_data import read_sts_benchmark
    from distributed_emb.evaluation.sts import spearman_of_embeddings
    from distributed_emb.mcr2 import pipeline
    from distributed_emb.model.embedder import local_encode
    from distributed_emb.tracking import read_train_log

    plotted = []

    def record_plot(panels, path, title=None):
        plotted.append(panels)
        return write_panels(panels, path, title)

    monkeypatch.setattr(pipeline, "write_panels", record_plot)
    config = load_config(MCR2Config, None, _overrides(tmp_path, tiny_bert_path, small_data))
    config.validate()
    results = pipeline.run(config)

    methods = [(row["dim"], row["method"]) for row in results["table"]]
    assert methods == [
        (4, "mcr2"), (4, "pca"), (4, "random"), (8, "mcr2"), (8, "pca"), (8, "random"),
        (32, "full"),
    ]  # fmt: skip
    rows = {(row["dim"], row["method"]): row for row in results["table"]}
    for dim in (4, 8):
        head = results["training"]["heads"][dim]
        assert rows[(dim, "mcr2")]["stsb_dev"] == pytest.approx(head["best_stsb_dev"])
    # Only STS-B is in this SentEval dir: the STS average is STS-B test; no transfer data.
    full = rows[(32, "full")]
    assert full["sts_tasks"] == ["STSBenchmark"] and full["sts_avg"] == full["stsb_test"]
    assert full["transfer_avg"] is None and full["retrieval_mrr"] is not None

    # The uncompressed row is the plain encoder scored by the project's STS function.
    test = read_sts_benchmark(small_data[0], "test")
    e1, e2 = (
        local_encode(s, tiny_bert_path, pooler="mean", max_seq_length=32)
        for s in (test.sentences1, test.sentences2)
    )
    assert full["stsb_test"] == pytest.approx(spearman_of_embeddings(e1, e2, test.scores), abs=1e-3)

    out = Path(config.output_dir)
    written = json.loads((out / "results.json").read_text())
    assert len(written["table"]) == 7 and "| 4 | mcr2 |" in (out / "results.md").read_text()
    model = SentenceTransformer(results["exported_models"][8], device="cpu")
    vectors = model.encode(test.sentences1[:5])
    assert vectors.shape == (5, 8)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)

    # The plot next to results.json: STS-B dev per size for each method, `full` as a reference
    # line, and each head's STS-B dev per epoch, all taken from the table and the histories.
    (panels,) = plotted
    dev = next(p for p in panels if p.title == "STS-B dev")
    assert dev.series == {
        m: [(d, rows[(d, m)]["stsb_dev"]) for d in (4, 8)] for m in ("mcr2", "pca", "random")
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


def _job_module():
    spec = importlib.util.spec_from_file_location("train_mcr2_job", REPO / "jobs" / "train_mcr2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "argv,message",
    [
        (["optim.epochz=3"], "unknown config key 'optim.epochz'"),
        (["output_dims=[64, 64]"], "output_dims: has duplicates"),
        (["loss.eps=0"], "loss.eps: must be > 0"),
        (["--senteval-data", "/no/such/dir"], "--senteval-data: /no/such/dir is not a directory"),
    ],
)
def test_job_rejects_bad_settings_before_doing_anything(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _job_module().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_job_defaults_are_the_dataclass_defaults():
    # The YAML spells out every knob; it must not drift from the code's defaults.
    assert _job_module().parse_args([]) == MCR2Config()
