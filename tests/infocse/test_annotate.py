"""Annotation through Ray with 2 actors gives exactly the single-process reference's pairs."""

from __future__ import annotations

import itertools
import json

import pytest

from distributed_emb.infocse.annotate import (
    AnnotationConfig,
    annotate_documents,
    annotate_documents_locally,
    document_seed,
)
from distributed_emb.infocse.idc import IDCConfig, intra_document_clusters
from distributed_emb.infocse.pairs import read_pairs


@pytest.fixture(scope="module")
def lee_documents(shared_data_dir) -> list[dict]:
    with open(shared_data_dir / "corpus" / "lee_documents.jsonl") as handle:
        rows = [json.loads(line) for line in itertools.islice(handle, 20)]
    return [{"doc_id": r["id"], "sentences": r["sentences"]} for r in rows]


def pair_tuples(rows):
    return sorted(
        (r["doc_id"], r["cluster_id"], r["anchor"], r["positive"], r["round"]) for r in rows
    )


def test_local_reference_matches_idc_per_document(tiny_bert_path, lee_documents):
    from distributed_emb.model.sentence_transformer import load_sentence_transformer

    config = AnnotationConfig(pooler="mean", idc=IDCConfig(top_k=2, max_pairs_per_cluster=5))
    docs = lee_documents[:4] + [{"doc_id": "single", "sentences": ["Only one sentence."]}]
    pairs, result = annotate_documents_locally(docs, tiny_bert_path, round_index=3, config=config)
    model = load_sentence_transformer(tiny_bert_path, pooler="mean")
    expected, clusters = [], 0
    for doc in docs:
        embeddings = model.encode(doc["sentences"], convert_to_numpy=True)
        idc = intra_document_clusters(embeddings, config.idc, document_seed(0, doc["doc_id"]))
        clusters += idc.num_clusters
        for (i, j), c in zip(idc.pairs.tolist(), idc.pair_clusters.tolist(), strict=True):
            expected.append((doc["doc_id"], c, doc["sentences"][i], doc["sentences"][j], 3))
    assert pair_tuples(pairs) == sorted(expected) and expected
    c = result.counts
    assert (c.documents, c.clusters, c.pairs) == (5, clusters, len(expected))
    assert c.sentences == sum(len(d["sentences"]) for d in docs)
    assert c.documents_without_pairs == 1  # the one-sentence document


@pytest.mark.ray
@pytest.mark.slow
def test_ray_two_actors_match_local_reference(
    ray_local, tiny_bert_path, lee_documents, tmp_path, monkeypatch, caplog
):
    import logging

    from distributed_emb.infocse import annotate
    from distributed_emb.progress_report import polled_progress

    def progress_lines(*args, **kwargs):  # off a terminal, with a line for every poll
        return polled_progress(*args, **kwargs, every_s=0.2, mode="lines", line_every_s=0)

    monkeypatch.setattr(annotate, "polled_progress", progress_lines)
    caplog.set_level(logging.INFO, logger="distributed_emb.progress_report")
    config = AnnotationConfig(
        pooler="mean",
        concurrency=2,
        documents_per_batch=3,  # several batches per actor, documents mixed in one encode
        idc=IDCConfig(top_k=1, max_pairs_per_cluster=2, seed=11),
    )
    documents = ray_local.data.from_items(lee_documents)
    result = annotate_documents(
        documents, tiny_bert_path, str(tmp_path / "round1"), round_index=1, config=config
    )
    ray_pairs = read_pairs(str(tmp_path / "round1"))
    local_pairs, local = annotate_documents_locally(
        lee_documents, tiny_bert_path, round_index=1, config=config, documents_per_encode=1
    )
    assert pair_tuples(ray_pairs) == pair_tuples(local_pairs)
    assert result.counts == local.counts
    assert result.counts.documents == 20 and result.counts.pairs == len(ray_pairs) > 0
    assert result.counts.capped_clusters > 0  # the per-document cap seed was exercised
    assert set(ray_pairs[0]) == {"anchor", "positive", "doc_id", "cluster_id", "round"}
    # The actors counted their documents: the progress's closing line has all 20.
    said = [r.getMessage() for r in caplog.records if r.name.endswith("progress_report")]
    assert said and said[-1].startswith("annotate round 1: 20 documents in"), said

    with pytest.raises(FileExistsError, match="already holds files"):
        annotate_documents(documents, tiny_bert_path, str(tmp_path / "round1"), config=config)
