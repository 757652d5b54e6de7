"""Label-free hard-negative mining: against a plain numpy reference on a small set (exact
neighbours, every filter and the window), the rules every mined negative obeys after the Ray
pass (jobs/mine_negatives.py end to end), and the inputs refused before Ray starts."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from embedding_outputs import unit, write_embedding_output
from harness.jobs import checked_config
from harness.jobs import run as run_job

from distributed_emb.checks import ConfigError
from distributed_emb.vectors.ann_index import build_index
from distributed_emb.vectors.hard_negatives import check_inputs, mine_shard
from distributed_emb.vectors.index_config import IndexConfig
from distributed_emb.vectors.mining_config import MiningConfig, MiningOutputConfig
from distributed_emb.vectors.shard_layout import ShardLayoutError, read_manifest

ROWS, DIM = 150, 8


def small_corpus(seed: int = 0):
    """(vectors, texts, documents): random unit vectors, five sentences a document, with
    near-duplicates of rows 10–19 in rows 0–9 (other documents: only the margin can remove
    them) and the texts of rows 25–29 repeated in rows 20–24 with unrelated vectors (only the
    text filter can remove them)."""
    rng = np.random.default_rng(seed)
    vectors = unit(rng.normal(size=(ROWS, DIM)))
    vectors[:10] = unit(vectors[10:20] + 0.02 * rng.normal(size=(10, DIM)))
    texts = [f"sentence {i}" for i in range(ROWS)]
    texts[20:25] = texts[25:30]
    return vectors, texts, np.arange(ROWS) // 5


def reference_negatives(
    vectors, ids, texts, documents, config: MiningConfig, every: bool = False
) -> dict:
    """{anchor id: [(negative id, score), ...]}: the rules written out one anchor at a time over
    every score at once ("top"; `every`: all that "random" may draw from, the passing
    candidates after range_min). Fails if a score lies within 2e-6 of another in the window or
    of the margin's threshold or max_score: there float32 rounding (≤ 1e-6 for these 8-dim
    products) could decide the order, and the data, not the code, would have to change."""
    scores = vectors.astype(np.float64) @ vectors.T.astype(np.float64)  # (n, n)
    threshold = 1.0 - config.relative_margin
    ceiling = np.inf if config.max_score is None else config.max_score
    chosen = {}
    for i in range(len(vectors)):
        order = [j for j in np.argsort(-scores[i], kind="stable") if j != i]
        window = order[: config.range_max]
        near = np.sort(scores[i, order[: config.range_max + 1]])
        assert np.diff(near).min() > 2e-6 and np.abs(near - threshold).min() > 2e-6
        assert np.abs(near - ceiling).min() > 2e-6
        passing = [
            j
            for j in window
            if scores[i, j] < threshold
            and scores[i, j] <= ceiling
            and texts[j] != texts[i]
            and not (config.skip_same_document and documents[j] == documents[i])
        ]
        last = config.range_max if every else config.range_min + config.num_negatives
        kept = passing[config.range_min : last]
        chosen[int(ids[i])] = [(int(ids[j]), float(scores[i, j])) for j in kept]
    return chosen


@pytest.mark.parametrize(
    "settings",
    [
        dict(num_negatives=3, range_min=0, range_max=20, relative_margin=0.05),
        dict(num_negatives=2, range_min=2, range_max=10, relative_margin=0.0,
             skip_same_document=False),
        dict(num_negatives=5, range_min=1, range_max=30, relative_margin=0.3),
        dict(num_negatives=4, range_min=0, range_max=4, relative_margin=0.1),
        dict(num_negatives=3, range_min=2, range_max=20, relative_margin=0.05, max_score=0.6),
    ],
)  # fmt: skip
def test_mined_negatives_are_the_numpy_references(tmp_path, settings):
    vectors, texts, documents = small_corpus()
    write_embedding_output(tmp_path, vectors, texts=texts, documents=documents, shards=3)
    manifest = read_manifest(str(tmp_path))
    config = MiningConfig(embeddings=str(tmp_path), exact=True, **settings)
    mined: dict[int, list] = {}
    without = 0
    for number in range(3):
        table, counts = mine_shard(manifest, number, config)
        without += counts.anchors_without_negative
        for row in table.to_pylist():
            mined.setdefault(row["id"], []).append((row["negative_id"], row["negative_score"]))
            assert row["text"] == texts[(row["id"] - 7) // 10]
            assert row["negative"] == texts[(row["negative_id"] - 7) // 10]
    ids = np.arange(ROWS) * 10 + 7
    expected = reference_negatives(vectors, ids, texts, documents, config)
    assert without == sum(1 for negatives in expected.values() if not negatives)
    for anchor, negatives in expected.items():
        found = mined.get(anchor, [])
        assert [n for n, _ in found] == [n for n, _ in negatives], anchor
        assert np.allclose([s for _, s in found], [s for _, s in negatives], atol=1e-5)


def test_random_sampling_draws_from_the_passing_candidates(tmp_path):
    """sampling_strategy "random" without labels: each anchor's negatives are num_negatives of
    the candidates "top" would walk past (after range_min, up to range_max; all of them where
    fewer pass), most similar first; a rerun, 1 shard instead of 3, and so other tasks give the
    same; another seed other ones; and it counts max_score's removals."""
    vectors, texts, documents = small_corpus()
    ids = np.arange(ROWS) * 10 + 7
    settings = dict(exact=True, num_negatives=3, range_min=1, range_max=15, relative_margin=0.05,
                    max_score=0.7, sampling_strategy="random", seed=5)  # fmt: skip
    mined = {}
    for shards in (3, 1):
        out = write_embedding_output(
            tmp_path / str(shards), vectors, texts=texts, documents=documents, shards=shards
        )
        manifest = read_manifest(str(out))
        for seed in (5, 5, 6):
            config = MiningConfig(embeddings=str(out), **{**settings, "seed": seed})
            found: dict[int, list] = {}
            removed = 0
            for number in range(shards):
                table, counts = mine_shard(manifest, number, config)
                removed += counts.removed_above_max_score
                for row in table.to_pylist():
                    found.setdefault(row["id"], []).append(
                        (row["negative_id"], row["negative_score"])
                    )
            assert mined.setdefault((shards, seed), found) == found  # the rerun
            assert removed > 0
    assert mined[(1, 5)].keys() == mined[(3, 5)].keys()
    for anchor, negatives in mined[(3, 5)].items():
        assert [n for n, _ in negatives] == [n for n, _ in mined[(1, 5)][anchor]]
    assert mined[(3, 6)] != mined[(3, 5)]
    every = reference_negatives(vectors, ids, texts, documents, config, every=True)
    top = reference_negatives(vectors, ids, texts, documents, dataclasses.replace(
        config, sampling_strategy="top"))  # fmt: skip
    differs = 0
    for anchor, allowed in every.items():
        found = mined[(3, 5)].get(anchor, [])
        assert {n for n, _ in found} <= {n for n, _ in allowed}, anchor
        assert len(found) == min(3, len(allowed)), anchor
        assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)
        differs += [n for n, _ in found] != [n for n, _ in top[anchor]]
    assert differs > ROWS // 2


def test_the_margin_is_what_removes_near_duplicates(tmp_path):
    """Rows 0–9 are near-duplicates of rows 10–19 (cosine > 0.99), each the other's nearest
    row: with the margin they never pair, without it (margin 0) each is the other's first
    negative; and with same-document rows allowed, that filter removes nothing."""
    vectors, texts, documents = small_corpus()
    write_embedding_output(tmp_path, vectors, texts=texts, documents=documents, shards=1)
    manifest = read_manifest(str(tmp_path))
    first = {}
    for margin in (0.05, 0.0):
        config = MiningConfig(
            embeddings=str(tmp_path), exact=True, num_negatives=1, range_max=5,
            relative_margin=margin, skip_same_document=margin > 0,
        )  # fmt: skip
        table, counts = mine_shard(manifest, 0, config)
        first[margin] = dict(zip(table["id"].to_pylist(), table["negative_id"].to_pylist()))
        if margin == 0.0:
            assert counts.removed_by_margin == counts.removed_same_document == 0
        else:
            assert counts.removed_by_margin == 20  # each pair, both ways
    for duplicate, original in zip(range(10), range(10, 20)):
        pair = {duplicate * 10 + 7, original * 10 + 7}
        for anchor in pair:
            assert first[0.0][anchor] == (pair - {anchor}).pop()
            assert first[0.05][anchor] not in pair


@pytest.fixture
def indexed_small(tmp_path):
    vectors, texts, documents = small_corpus(seed=1)
    out = tmp_path / "embeddings"
    write_embedding_output(out, vectors, texts=texts, documents=documents, shards=3)
    build_index(str(out), IndexConfig(kind="hnsw", hnsw_m=8), use_ray=False)
    return out, vectors, texts, documents


def test_mining_job_writes_negatives_that_obey_every_rule(ray_local, indexed_small, tmp_path):
    """jobs/mine_negatives.py: the Ray Data pass over the shards with the index, one file per
    shard, and summary.json's counts agreeing with the files."""
    out, vectors, texts, documents = indexed_small
    result = tmp_path / "negatives"
    status = run_job(
        "mine_negatives",
        [str(out), "--output", str(result), "--num-negatives", "3", "--range-max", "20",
         "--relative-margin", "0.1"],
    )  # fmt: skip
    assert status == 0
    manifest = read_manifest(str(out))
    files = sorted(p.name for p in (result / "negatives").iterdir())
    assert files == [s.file.removeprefix("shards/") for s in manifest.shards]
    table = pq.read_table(result / "negatives")
    row = (table["id"].to_numpy() - 7) // 10
    negative = (table["negative_id"].to_numpy() - 7) // 10
    scores = table["negative_score"].to_numpy()
    assert (row != negative).all()
    assert (documents[row] != documents[negative]).all()
    assert (np.array(texts)[row] != np.array(texts)[negative]).all()
    assert (scores < 0.9).all()
    assert np.allclose(scores, np.sum(vectors[row] * vectors[negative], axis=1), atol=1e-5)
    assert table["negative"].to_pylist() == [texts[j] for j in negative]
    per_anchor = np.bincount(row, minlength=ROWS)
    assert per_anchor.max() <= 3
    summary = json.loads((result / "summary.json").read_text())
    assert summary["anchors"] == ROWS and summary["negatives"] == len(table)
    assert summary["anchors_without_negative"] == int((per_anchor == 0).sum())
    # The 10 near-duplicate pairs, both ways (each is the other's nearest row), and random
    # pairs above 0.9; the repeated texts that fall inside each other's window.
    assert summary["removed_by_margin"] >= 20
    assert summary["removed_same_text"] >= 1


def test_shards_without_text_are_refused_before_ray(tmp_path):
    write_embedding_output(tmp_path, unit(np.eye(8)), shards=2)
    config = MiningConfig(embeddings=str(tmp_path), exact=True)
    with pytest.raises(ShardLayoutError, match=r"part-000000000007.parquet: no text column"):
        check_inputs(config)


def test_binary_embeddings_are_refused_before_ray(tmp_path):
    """Binary outputs are indexed and searched (rescored), but the margin filter is a cosine of
    float vectors: mining refuses them, saying why."""
    rng = np.random.default_rng(5)
    texts = [f"row {i}" for i in range(16)]
    write_embedding_output(tmp_path, unit(rng.normal(size=(16, 16))), texts, dtype="ubinary")
    with pytest.raises(ShardLayoutError, match="dtype ubinary: mining compares float vectors"):
        check_inputs(MiningConfig(embeddings=str(tmp_path), exact=True))


def test_an_output_holding_earlier_negatives_is_refused(indexed_small, tmp_path):
    out, *_ = indexed_small
    earlier = tmp_path / "earlier"
    (earlier / "negatives").mkdir(parents=True)
    (earlier / "run.log").write_text("the job's log: no reason to refuse\n")
    config = MiningConfig(embeddings=str(out), output=MiningOutputConfig(dir=str(earlier)))
    check_inputs(config)
    (earlier / "negatives" / "part-000000000007.parquet").write_bytes(b"")
    with pytest.raises(ConfigError, match=rf"output.dir: {earlier} holds earlier negatives"):
        check_inputs(config)


def test_a_window_too_small_for_the_negatives_is_refused(indexed_small, tmp_path):
    out, *_ = indexed_small
    argv = [str(out), "--output", str(tmp_path / "n"), "--num-negatives", "5", "--range-min",
            "8", "--range-max", "10"]  # fmt: skip
    with pytest.raises(ConfigError, match="num_negatives: 5 do not fit the window"):
        checked_config("mine_negatives", argv)
    config = checked_config("mine_negatives", argv[:3] + ["--num-negatives", "2"] + argv[5:])
    assert (config.num_negatives, config.range_min, config.range_max) == (2, 8, 10)
    # range_max null: sentence-transformers' derivation, range_min + 10 × num_negatives (a
    # margin is set) + p, which always holds them; without a margin or max_score, 1 × instead.
    config = checked_config("mine_negatives", argv[:7] + ["range_max=null"])
    assert (config.window_max(), config.window_max(3)) == (8 + 50 + 1, 8 + 50 + 3)
    config = dataclasses.replace(config, relative_margin=None)
    assert config.window_max(2) == 8 + 5 + 2
    assert dataclasses.replace(config, max_score=0.9).window_max(2) == 8 + 50 + 2


@pytest.mark.parametrize(
    "flags, error",
    [
        (["--sampling-strategy", "hardest"],
         r"sampling_strategy: expected one of \['top', 'random'\], got 'hardest'"),
        (["--max-score", "1.5"], r"max_score: must be in \[-1, 1\] or null, got 1.5"),
        (["--min-score", "-2"], r"min_score: must be in \[-1, 1\] or null, got -2.0"),
        (["--min-score", "0.8", "--max-score", "0.5"],
         r"min_score: must be ≤ max_score \(0.5\), got 0.8"),
        (["--seed", "-1"], "seed: must be >= 0, got -1"),
    ],
)  # fmt: skip
def test_sampling_and_score_settings_are_checked(indexed_small, tmp_path, flags, error):
    out, *_ = indexed_small
    with pytest.raises(ConfigError, match=error):
        checked_config("mine_negatives", [str(out), "--output", str(tmp_path / "n"), *flags])
