"""Transfer protocol on small synthetic tasks, checked against a plain SentEval-style loop."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from distributed_emb.checks import ConfigError
from distributed_emb.evaluation.senteval_data import ClassificationData, PairClassificationData
from distributed_emb.evaluation.transfer import (
    TransferConfig,
    evaluate_binary,
    evaluate_mrpc,
    evaluate_sst2,
    evaluate_trec,
    inner_kfold_accuracy,
    kfold_then_test,
    mrpc_pair_features,
    senteval_order,
)
from distributed_emb.settings import build

FAST = TransferConfig(kfold=3, inner_kfold_c=(0.25, 1.0, 4.0), kfold_c=(0.5, 2.0, 8.0))


def blobs(n: int, d: int, separation: float, seed: int):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    x = rng.normal(size=(n, d))
    x[:, 0] += separation * (2 * y - 1)
    return x, y


def reference_inner_kfold(x, y, k, grid, seed=1111):
    """SentEval's InnerKFoldClassifier.run (sklearn branch), written out plainly."""
    skf = StratifiedKFold(n_splits=k, shuffle=True, random_state=1111)
    innerskf = StratifiedKFold(n_splits=k, shuffle=True, random_state=1111)
    dev, test = [], []
    for train_idx, test_idx in skf.split(x, y):
        x_train, x_test, y_train, y_test = x[train_idx], x[test_idx], y[train_idx], y[test_idx]
        scores = []
        for reg in grid:
            regscores = []
            for a, b in innerskf.split(x_train, y_train):
                clf = LogisticRegression(C=reg, random_state=seed, max_iter=1000)
                clf.fit(x_train[a], y_train[a])
                regscores.append(clf.score(x_train[b], y_train[b]))
            scores.append(round(100 * np.mean(regscores), 2))
        optreg = grid[np.argmax(scores)]
        dev.append(np.max(scores))
        clf = LogisticRegression(C=optreg, random_state=seed, max_iter=1000)
        clf.fit(x_train, y_train)
        test.append(round(100 * clf.score(x_test, y_test), 2))
    return round(np.mean(dev), 2), round(np.mean(test), 2)


def test_inner_kfold_equals_plain_senteval_loop():
    x, y = blobs(150, 6, separation=0.6, seed=0)  # overlapping: C matters a little
    result = inner_kfold_accuracy(x, y, FAST)
    assert (result["devacc"], result["acc"]) == reference_inner_kfold(x, y, 3, FAST.inner_kfold_c)
    assert result["n_fits"] == 3 * (3 * 3 + 1)
    assert len(result["chosen_c"]) == 3


def test_separable_data_scores_high_and_random_labels_score_chance():
    x, y = blobs(300, 8, separation=4.0, seed=1)
    assert inner_kfold_accuracy(x, y, FAST)["acc"] > 97
    rng = np.random.default_rng(2)
    noise, random_labels = rng.normal(size=(600, 8)), rng.integers(0, 2, size=600)
    assert 40 < inner_kfold_accuracy(noise, random_labels, FAST)["acc"] < 60


def test_kfold_then_test_picks_c_on_train_only():
    x, y = blobs(200, 5, separation=3.0, seed=3)
    result = kfold_then_test(x[:150], y[:150], x[150:], y[150:], FAST)
    assert result["chosen_c"][0] in FAST.kfold_c
    assert result["acc"] == pytest.approx(100 * np.mean(result["predictions"] == y[150:]))
    assert result["acc"] > 95 and result["n_fits"] == 3 * 3 + 1


def test_senteval_order_sorts_by_length_then_label_stably():
    order = senteval_order([3, 1, 3, 1, 2], np.array([1, 1, 0, 0, 0]))
    assert order.tolist() == [3, 1, 4, 2, 0]


def test_mrpc_features():
    u, v = np.array([[1.0, -2.0]]), np.array([[3.0, 1.0]])
    assert mrpc_pair_features(u, v).tolist() == [[2.0, 3.0, 3.0, -2.0]]
    assert mrpc_pair_features(u, v, "full").tolist() == [[1, -2, 3, 1, 2, 3, 3, -2]]


def _label_encoder(label_of: dict[str, int], seed: int = 0):
    """Embeds a sentence near ±e₀ by its label: only an aligned (sentence, label) order
    lets the classifier learn it."""
    rng = np.random.default_rng(seed)
    table = {
        s: rng.normal(size=4) + np.array([3.0 * (2 * y - 1), 0, 0, 0]) for s, y in label_of.items()
    }
    return lambda sentences: np.array([table[s] for s in sentences])


def _toy(n: int, prefix: str, seed: int) -> ClassificationData:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=n)
    sentences = [f"{prefix} {i} " + "w " * int(rng.integers(0, 5)) for i in range(n)]
    return ClassificationData([" ".join(s.split()) for s in sentences], labels, prefix)


def test_task_wrappers_keep_sentences_and_labels_aligned():
    data = _toy(120, "bin", 4)
    encode = _label_encoder(dict(zip(data.sentences, data.labels, strict=True)))
    assert evaluate_binary(encode, data, FAST)["acc"] > 95
    train, dev, test = _toy(100, "tr", 5), _toy(40, "dv", 6), _toy(40, "te", 7)
    every = {s: y for d in (train, dev, test) for s, y in zip(d.sentences, d.labels, strict=True)}
    encode = _label_encoder(every)
    sst = evaluate_sst2(encode, train, dev, test, FAST)
    assert sst["acc"] > 95 and (sst["n_train"], sst["n_dev"], sst["n_test"]) == (100, 40, 40)
    assert evaluate_trec(encode, train, test, FAST)["acc"] > 95


def test_mrpc_wrapper_learns_pair_relation():
    # Paraphrase pairs embed identically; non-paraphrases are independent: |u − v| separates.
    rng = np.random.default_rng(8)

    def pairs(n, prefix):
        labels = rng.integers(0, 2, size=n)
        return PairClassificationData(
            [f"{prefix}a{i}" for i in range(n)], [f"{prefix}b{i}" for i in range(n)], labels, prefix
        )

    train, test = pairs(120, "tr"), pairs(60, "te")
    table = {}
    for d in (train, test):
        for a, b, y in zip(d.sentences1, d.sentences2, d.labels, strict=True):
            table[a] = rng.normal(size=6)
            table[b] = table[a] + 0.05 * rng.normal(size=6) if y else rng.normal(size=6)
    result = evaluate_mrpc(lambda s: np.array([table[x] for x in s]), train, test, FAST)
    assert result["acc"] > 90 and result["f1"] > 90 and result["features"] == "senteval"


def test_config_rejects_bad_values():
    # The section's ranges are its declarations (distributed_emb/settings.py).
    with pytest.raises(ConfigError, match=r"^kfold: must be >= 2, got 1 — folds of the"):
        build(TransferConfig, {"kfold": 1})
    with pytest.raises(
        ConfigError, match=r"^mrpc_features: expected one of \['senteval', 'full'\], got 'concat'"
    ):
        build(TransferConfig, {"mrpc_features": "concat"})
    with pytest.raises(ConfigError, match=r"^kfold_c\[1\]: must be > 0, got 0 — C values"):
        build(TransferConfig, {"kfold_c": [1.0, 0]})
    with pytest.raises(ConfigError, match=r"^seed: must be in \[0, 4294967295\], got -1"):
        build(TransferConfig, {"seed": -1})
    with pytest.raises(ConfigError, match=r"^max_iter: must be >= 1, got 0"):
        build(TransferConfig, {"max_iter": 0})
    # An empty grid: the one check the declarations cannot make.
    with pytest.raises(ConfigError, match=r"^eval.transfer.inner_kfold_c: give at least one C"):
        build(TransferConfig, {"inner_kfold_c": []}).validate("eval.transfer")
    built = build(TransferConfig, {"kfold_c": [0.5, 2]})
    assert built.kfold_c == (0.5, 2.0)
    built.validate()
