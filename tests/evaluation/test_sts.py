"""STS metric: cosine + Spearman against plain references, and the published MiniLM figure."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import rankdata

from distributed_emb.evaluation.senteval_data import SentEvalDataError, StsData, read_sts_benchmark
from distributed_emb.evaluation.sts import (
    aggregate_subsets,
    pair_cosines,
    read_stsb,
    spearman_of_embeddings,
    sts_spearman,
    sts_subsets_spearman,
    stsb_score,
)


def _plain_spearman(a: np.ndarray, b: np.ndarray) -> float:
    # Pearson correlation of average ranks: the definition, with ties handled by rankdata.
    ra, rb = rankdata(a), rankdata(b)
    return float(np.corrcoef(ra, rb)[0, 1]) * 100


def test_spearman_of_embeddings_matches_definition():
    rng = np.random.default_rng(0)
    e1, e2 = rng.normal(size=(50, 8)), rng.normal(size=(50, 8))
    gold = rng.integers(0, 6, size=50).astype(float)  # ties, like real STS scores
    cos = np.array(
        [u @ v / np.linalg.norm(u) / np.linalg.norm(v) for u, v in zip(e1, e2, strict=True)]
    )
    assert np.allclose(pair_cosines(e1, e2), cos)
    assert spearman_of_embeddings(e1, e2, gold) == pytest.approx(_plain_spearman(cos, gold))


def test_zero_vector_gives_zero_cosine_like_senteval():
    e1 = np.array([[0.0, 0.0], [1.0, 0.0]])
    e2 = np.array([[1.0, 0.0], [1.0, 0.0]])
    assert pair_cosines(e1, e2).tolist() == [0.0, 1.0]


def test_sts_spearman_keeps_pairs_aligned():
    # An encoder whose embedding encodes the sentence's number: sentence pairs "k"/"k" are
    # identical (cosine 1) and pairs "k"/"-k" are opposite, so the order of rows matters.
    def encode(sentences):
        return np.array([[float(s), 1.0] for s in sentences])

    data = StsData(["1", "2", "3", "4"], ["1", "-2", "3", "-4"], np.array([5.0, 1, 5, 0]), "t")
    assert sts_spearman(encode, data) == pytest.approx(100.0)
    flipped = StsData(data.sentences1, data.sentences2, 5 - data.scores, "t")
    assert sts_spearman(encode, flipped) == pytest.approx(-100.0)


def test_encoder_returning_wrong_rows_is_an_error():
    data = StsData(["a", "b"], ["c", "d"], np.array([1.0, 2.0]), "t")
    with pytest.raises(ValueError, match="expected"):
        sts_spearman(lambda s: np.zeros((3, 2)), data)


@pytest.mark.slow
def test_minilm_mean_pooling_stsb_test_is_published_figure(minilm_path, senteval_dir):
    import torch

    from distributed_emb.model.sentence_transformer import load_sentence_transformer

    torch.set_num_threads(2)
    model = load_sentence_transformer(minilm_path, pooler="mean", device="cpu")
    data = read_sts_benchmark(senteval_dir, "test")
    assert len(data) == 1379
    score = sts_spearman(lambda s: model.encode(s, batch_size=64), data)
    assert score == pytest.approx(82.03, abs=0.05)


def test_pooled_mean_and_weighted_mean_on_hand_made_numbers():
    # Subset A: perfectly ranked (ρ = 1). Subset B: perfectly reversed (ρ = −1), twice as big.
    # Pooled ranks all 9 pairs together, which neither average reproduces.
    system_a, gold_a = np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0, 3.0])
    system_b, gold_b = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4]), np.arange(6.0)
    result = aggregate_subsets(["A", "B"], [system_a, system_b], [gold_a, gold_b])
    assert result["subsets"]["A"] == {"spearman": pytest.approx(100.0), "n": 3}
    assert result["subsets"]["B"]["spearman"] == pytest.approx(-100.0)
    assert result["mean"] == pytest.approx(0.0)
    assert result["wmean"] == pytest.approx((3 * 100 - 6 * 100) / 9)
    pooled = _plain_spearman(np.r_[system_a, system_b], np.r_[gold_a, gold_b])
    assert result["all"] == pytest.approx(pooled)
    assert result["all"] != pytest.approx(result["mean"]) and result["n"] == 9


def test_sts_subsets_spearman_splits_subsets_back():
    def encode(sentences):
        return np.array([[float(s), 1.0] for s in sentences])

    a = StsData(["1", "2", "3"], ["1", "-2", "3"], np.array([5.0, 0.0, 4.0]), "Y/a")
    b = StsData(["4", "5"], ["-4", "5"], np.array([0.0, 5.0]), "Y/b", n_unscored=2)
    result = sts_subsets_spearman(encode, [a, b])
    assert set(result["subsets"]) == {"a", "b"}
    assert result["subsets"]["a"]["spearman"] == pytest.approx(sts_spearman(encode, a))
    assert result["subsets"]["b"] == {"spearman": pytest.approx(100.0), "n": 2, "n_unscored": 2}
    cos = np.r_[
        pair_cosines(encode(a.sentences1), encode(a.sentences2)),
        pair_cosines(encode(b.sentences1), encode(b.sentences2)),
    ]
    assert result["all"] == pytest.approx(_plain_spearman(cos, np.r_[a.scores, b.scores]))


def _hashed_vectors(sentences: list[str]) -> np.ndarray:
    """A fixed embedding per sentence (bag of character codes): deterministic, model-free."""
    vectors = np.zeros((len(sentences), 64))
    for row, sentence in enumerate(sentences):
        for char in sentence.lower():
            vectors[row, ord(char) % 64] += 1.0
    return vectors


def test_stsb_defaults_to_the_shipped_split_and_keeps_the_first_max_pairs():
    full = read_stsb("dev")
    cut = read_stsb("dev", max_pairs=40)
    assert len(full) > 40 and len(cut) == 40
    assert cut.sentences1 == full.sentences1[:40] and list(cut.scores) == list(full.scores[:40])
    score = stsb_score(_hashed_vectors, "dev", max_pairs=40)
    assert score == sts_spearman(_hashed_vectors, cut)
    assert score != stsb_score(_hashed_vectors, "dev")  # the cut really is a different set


def test_stsb_without_the_split_names_the_missing_file(tmp_path):
    with pytest.raises(SentEvalDataError, match="STS"):
        stsb_score(_hashed_vectors, "test", str(tmp_path))
