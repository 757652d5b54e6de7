"""A 2-round InfoCSE run on a tiny BERT through Ray: annotate → train → evaluate → export."""

import json
from pathlib import Path

import numpy as np
import pytest

from distributed_emb.config import ConfigError, load_config
from distributed_emb.infocse.config import InfoCSEConfig


def _config(tmp_path, tiny_bert_path, shared_data_dir, extra=()):
    lines = (shared_data_dir / "corpus" / "lee_documents.jsonl").read_text().splitlines()[:24]
    documents = tmp_path / "docs.jsonl"
    documents.write_text("\n".join(lines))
    return load_config(
        InfoCSEConfig,
        "jobs/configs/infocse_default.yaml",
        [
            f"documents.paths=[{documents}]",
            "annotation.pooler=mean",
            "annotation.max_seq_length=32",
            f"training.model.path={tiny_bert_path}",
            "training.train.batch_size=8",
            "training.train.max_steps=2",
            "training.train.learning_rate=1.0e-4",
            "training.eval.eval_steps=2",
            "training.eval.max_pairs=64",
            "rounds.max_rounds=2",
            "rounds.patience=2",
            f"output_dir={tmp_path / 'out'}",
            *extra,
        ],
    )


def test_config_errors_name_the_section_key(tmp_path, tiny_bert_path, shared_data_dir):
    with pytest.raises(ConfigError, match=r"rounds\.max_rounds"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["rounds.max_rounds=0"])
    with pytest.raises(ConfigError, match=r"training\.loss\.temperature"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["training.loss.temperature=0"])
    with pytest.raises(ConfigError, match="documents.paths"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["documents.paths=[/no/such.jsonl]"])


@pytest.mark.slow
@pytest.mark.ray
def test_two_rounds_annotate_train_and_export_the_best(
    ray_local, tmp_path, tiny_bert_path, shared_data_dir
):
    from sentence_transformers import SentenceTransformer

    from distributed_emb.infocse.rounds import run_rounds

    config = _config(tmp_path, tiny_bert_path, shared_data_dir)
    records = run_rounds(config)

    stages = [(r.round, r.stage) for r in records]
    assert stages == [(0, "initial"), (1, "infocse"), (2, "infocse")]
    assert all(r.pairs > 0 and r.train_steps == 2 for r in records[1:])
    # A round keeps a trained checkpoint, never its starting model (run_rounds compares rounds).
    assert all(r.kept_step == 2 and r.last_step_dev is not None for r in records[1:])
    assert records[2].overlap_with_previous is not None
    assert 0.0 <= records[2].overlap_with_previous <= 1.0
    # Round 2 annotated with round 1's model: its input model is round 1's export.
    saved = json.loads((tmp_path / "out" / "rounds.json").read_text())
    best = max(records, key=lambda r: r.stsb_dev)
    assert saved["best"]["round"] == best.round
    # The exported model is the best round's model.
    sentences = ["A man is playing a guitar.", "The stock market fell."]
    exported = SentenceTransformer(str(tmp_path / "out" / "model"), device="cpu").encode(sentences)
    if best.stage != "initial":
        reference = SentenceTransformer(best.model_dir, device="cpu").encode(sentences)
        np.testing.assert_allclose(exported, reference, rtol=1e-6, atol=1e-6)
    assert (tmp_path / "out" / "rounds.md").read_text().startswith("round")
    assert Path(records[1].model_dir).is_dir()


def test_every_round_annotates_at_the_initial_models_length(tmp_path, tiny_bert_path):
    from distributed_emb.infocse.annotate import AnnotationConfig
    from distributed_emb.infocse.rounds import _with_fixed_length
    from distributed_emb.model.sentence_transformer import load_sentence_transformer

    initial = tmp_path / "initial"
    load_sentence_transformer(tiny_bert_path, pooler="mean", max_seq_length=48).save(str(initial))
    resolved = _with_fixed_length(AnnotationConfig(), str(initial))
    assert resolved.max_seq_length == 48  # not a later round's export's training length
    assert (
        _with_fixed_length(AnnotationConfig(max_seq_length=20), str(initial)).max_seq_length == 20
    )


@pytest.mark.slow
@pytest.mark.ray
def test_a_round_can_stream_its_pairs_straight_from_the_annotation_shards(
    ray_local, tmp_path, tiny_bert_path, shared_data_dir
):
    """rounds.arrange_pairs=false: no driver pass over the pairs; training reads the Parquet
    shards the annotation actors wrote."""
    import pyarrow.parquet as pq

    from distributed_emb.infocse.rounds import run_rounds

    config = _config(
        tmp_path,
        tiny_bert_path,
        shared_data_dir,
        ["rounds.max_rounds=1", "rounds.arrange_pairs=false"],
    )
    records = run_rounds(config)
    shards = sorted((tmp_path / "out" / "round_1" / "pairs").glob("*.parquet"))
    assert shards and not (tmp_path / "out" / "round_1" / "pairs_arranged.parquet").exists()
    mined = sum(pq.ParquetFile(shard).metadata.num_rows for shard in shards)
    assert records[1].pairs == mined and records[1].train_steps == 2
    metrics = json.loads((tmp_path / "out" / "round_1" / "train" / "metrics.json").read_text())
    assert 0 < metrics["corpus"]["kept"] <= mined  # rows streamed from the shards
