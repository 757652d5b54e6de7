"""Training on documents (documents.paths) and the default choice of what chooses
(eval.select_by=auto): the run trains on all but its held-out documents' sentences, chooses
its checkpoint on the held-out documents' dev split, and reports both yardsticks of the
export against the given model."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from harness.jobs import checked_config
from harness.tiny_run import TINY_YAML, tiny_beir_dir

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.data.beir_layout import read_splits
from distributed_emb.paths import shipped_corpus
from distributed_emb.selection import SELECT_METRIC

LEE = shipped_corpus("lee_documents.jsonl")


def _documents(tmp_path: Path, count: int = 60) -> Path:
    path = tmp_path / "documents.jsonl"
    path.write_text("\n".join(Path(LEE).read_text().splitlines()[:count]) + "\n")
    return path


def test_auto_chooses_on_what_is_in_domain(tmp_path):
    """The user's BEIR dev split first, then the run's own held-out documents, and STS-B dev
    only where there is nothing in-domain (the shipped Wikipedia sentences)."""
    out = f"output.dir={tmp_path / 'out'}"
    assert checked_config("train_informin", [out]).eval.select_by == "stsb_dev"
    documents = f"documents.paths=[{_documents(tmp_path)}]"
    assert checked_config("train_informin", [out, documents]).eval.select_by == "documents:dev"
    beir = f"eval.retrieval_dir={tiny_beir_dir(tmp_path / 'beir')}"
    assert checked_config("train_informin", [out, documents, beir]).eval.select_by == (
        "retrieval:dev"
    )
    explicit = checked_config("train_informin", [out, documents, "eval.select_by=stsb_dev"])
    assert explicit.eval.select_by == "stsb_dev"  # what the user names is what chooses


def test_a_search_on_documents_chooses_by_the_same_name(tmp_path):
    """One name in every job and in Tune: the search's base config chooses on documents:dev."""
    config = checked_config(
        "tune_informin", ["--output", str(tmp_path), f"documents.paths=[{_documents(tmp_path)}]"]
    )
    assert config.eval.select_by == config.base().eval.select_by == "documents:dev"


def test_documents_and_a_sentence_corpus_are_one_or_the_other(tmp_path):
    with pytest.raises(ConfigError, match=r"^data\.path: and documents\.paths both name"):
        checked_config(
            "train_informin",
            [f"output.dir={tmp_path}", f"documents.paths=[{_documents(tmp_path)}]",
             f"data.path={LEE}"],
        )  # fmt: skip
    with pytest.raises(ConfigError, match=r"^eval\.select_by: documents:dev needs eval\.doc"):
        checked_config(
            "train_informin",
            [f"output.dir={tmp_path}", "eval.documents_dir=null", "eval.select_by=documents:dev"],
        )


def test_every_evaluation_of_the_tiny_run_reports_the_document_yardstick(tiny_run, ray_local):
    """The session's tiny run chooses on its BEIR dev split; the shipped document-level
    example is scored beside it at every evaluation (topic beside paraphrase)."""
    _, result = tiny_run
    history = result.metrics["history"]
    assert history and all(0 <= row["documents_dev_ndcg_at_10"] <= 100 for row in history)
    assert all(row[SELECT_METRIC] == row["retrieval_dev_ndcg_at_10"] for row in history)


@pytest.fixture(scope="module")
def documents_run(tmp_path_factory, tiny_bert_path):
    """One tiny run on documents: the run itself (preparation, training, the choice and the
    report) is what these tests are about."""
    from harness import local_ray

    from distributed_emb.train.driver import run_training

    local_ray.start_shared_ray()
    tmp = tmp_path_factory.mktemp("documents_run")
    config = load_config(
        TrainingConfig,
        str(TINY_YAML),
        [f"model.path={tiny_bert_path}", f"documents.paths=[{_documents(tmp)}]",
         "heldout.fraction=0.3", "eval.test_after_training=true", f"output.dir={tmp / 'run'}",
         "train.max_steps=2", "train.num_workers=1"],
    )  # fmt: skip
    return config, run_training(config)


def test_a_run_on_documents_chooses_on_its_held_out_documents(documents_run, ray_local):
    config, result = documents_run
    metrics = result.metrics
    assert config.eval.select_by == metrics["select_by"] == "documents:dev"
    assert all(row[SELECT_METRIC] == row["documents_dev_ndcg_at_10"] for row in metrics["history"])
    topic = metrics["yardsticks"]["topic"]
    assert Path(topic["documents_dir"]).name == "eval"  # its own, not the shipped example
    assert "stsb_test" in metrics["yardsticks"]["paraphrase"]
    assert json.loads((Path(config.output.dir) / "metrics.json").read_text())["yardsticks"]


def test_the_held_out_documents_are_never_trained_on(documents_run, ray_local):
    config, result = documents_run
    eval_dir = Path(result.metrics["yardsticks"]["topic"]["documents_dir"])
    trained = set()
    for file in sorted((eval_dir.parent / "train").rglob("*.parquet")):
        trained |= set(pq.read_table(file, columns=["doc_id"]).column("doc_id").to_pylist())
    dev, test = read_splits(str(eval_dir), ["dev", "test"])
    evaluated = {pid.split("#")[0] for pid in dev.corpus_ids}
    assert trained and evaluated and not trained & evaluated
    assert len(trained) + len(evaluated) <= 60


def test_a_second_run_reuses_the_prepared_documents(documents_run, ray_local):
    from distributed_emb.train.document_corpus import COMPLETE
    from distributed_emb.train.driver import train_on_documents

    config, result = documents_run
    eval_dir = Path(result.metrics["yardsticks"]["topic"]["documents_dir"])
    complete = eval_dir.parent / COMPLETE
    before = complete.stat().st_mtime_ns
    again = train_on_documents(config)
    assert again.eval.documents_dir == str(eval_dir) and complete.stat().st_mtime_ns == before
