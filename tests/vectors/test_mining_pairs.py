"""Mining labelled (anchor, positive) pairs: against sentence-transformers' own
`mine_hard_negatives` on real sentence pairs with the packaged MiniLM ("top": the same
negatives, ties aside; "random": drawn from the candidates its filters allow, as many, the same
on a rerun and under any sharding), the rules every mined negative obeys after the Ray pass
(jobs/mine_negatives.py --anchors end to end), and its output read by the training data path as
pairs with a hard negative, and the unlabelled output as sentences with one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from embedding_outputs import unit, write_embedding_output
from harness.jobs import run as run_job

from distributed_emb.checks import ConfigError
from distributed_emb.data.corpus import corpus_path, text_rules
from distributed_emb.data.data_config import DataConfig, validate_negative_column
from distributed_emb.data.readers import DROP, iter_parsed_blocks
from distributed_emb.data.sources import resolve_sources
from distributed_emb.vectors.hard_negatives import check_inputs, mine_shard
from distributed_emb.vectors.mining_config import MiningConfig
from distributed_emb.vectors.shard_layout import read_manifest

PAIRS = 60  # dev qrels of the shipped news set: (STS-B sentence 1, its sentence 2)
TIE = 1e-5  # scores closer than this may be ordered differently by torch and numpy float32


def news_pairs() -> tuple[list[str], list[str]]:
    """(anchors, positives) of the first PAIRS dev qrels, and two rows more: the second
    anchor again with the last pair's positive (an anchor with two positives, in adjacent rows,
    and a positive two anchors share), and the next query with the sixth positive (a text the
    positives' output holds twice, which is one entry of sentence-transformers' corpus)."""
    from distributed_emb.paths import shipped_news_retrieval_dir

    where = Path(shipped_news_retrieval_dir())

    def texts(name: str) -> dict[str, str]:
        with (where / name).open(encoding="utf-8") as lines:
            return {row["_id"]: row["text"] for row in map(json.loads, lines)}

    queries, corpus = texts("queries.jsonl"), texts("corpus.jsonl")
    qrels = [line.split("\t")[:2] for line in (where / "qrels/dev.tsv").read_text().splitlines()]
    pairs = [(queries[q], corpus[c]) for q, c in qrels[1 : PAIRS + 2]]  # after the header
    anchors, positives = [a for a, _ in pairs[:PAIRS]], [p for _, p in pairs[:PAIRS]]
    anchors.insert(2, anchors[1])
    positives.insert(2, positives[-1])
    anchors.append(pairs[PAIRS][0])
    positives.append(positives[5])
    return anchors, positives


@pytest.fixture(scope="module")
def minilm_pairs(minilm_path, tmp_path_factory):
    """The pairs, the model, and the two embedding outputs the embed job would write for the
    pair table's anchor and positive columns (ids 10·row + 7 in both; 2 and 3 shards), with
    the vectors sentence-transformers computes inside mine_hard_negatives: each distinct
    anchor with encode_query, each distinct positive with encode_document, in its batches."""
    from sentence_transformers import SentenceTransformer

    anchors, positives = news_pairs()
    assert not set(anchors) & set(positives)  # no candidate is dropped for the anchor's text
    model = SentenceTransformer(minilm_path, device="cpu")
    options = dict(batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
    queries, corpus = list(dict.fromkeys(anchors)), list(dict.fromkeys(positives))
    query_vectors = dict(zip(queries, model.encode_query(queries, **options)))
    corpus_vectors = dict(zip(corpus, model.encode_document(corpus, **options)))
    root = tmp_path_factory.mktemp("minilm_pairs")
    anchors_out, positives_out = root / "anchors", root / "positives"
    write_embedding_output(
        anchors_out, np.stack([query_vectors[a] for a in anchors]), texts=anchors, shards=2
    )
    write_embedding_output(
        positives_out, np.stack([corpus_vectors[p] for p in positives]), texts=positives
    )
    return {
        "anchors": anchors,
        "positives": positives,
        "model": model,
        "query_vectors": query_vectors,
        "corpus_vectors": corpus_vectors,
        "anchors_out": anchors_out,
        "positives_out": positives_out,
        "cache": root / "st_cache",
    }


def near_ties(data: dict, config: MiningConfig) -> set[str]:
    """The anchors whose negatives float32 rounding could decide: two of the window's scores
    (range_max + the most positives an anchor has, and one more) within TIE of each other, or
    a candidate's within TIE of a margin's threshold, max_score or min_score. Scores in
    float64, per distinct text."""
    groups: dict[str, list[str]] = {}
    for anchor, positive in zip(data["anchors"], data["positives"]):
        groups.setdefault(anchor, []).append(positive)
    corpus = list(data["corpus_vectors"])
    vectors = np.stack([data["corpus_vectors"][c] for c in corpus]).astype(np.float64)
    most = max(len(p) for p in groups.values())
    window = config.window_max(most) + most
    ambiguous = set()
    for anchor, own in groups.items():
        scores = vectors @ data["query_vectors"][anchor].astype(np.float64)
        order = np.argsort(-scores)[: window + 1]
        near = scores[order]
        tied = bool((np.abs(np.diff(near)) < TIE).any())
        positive = min(scores[corpus.index(p)] for p in own)
        candidates = np.array([scores[j] for j in order[:window] if corpus[j] not in own])
        if config.relative_margin is not None:
            threshold = positive - abs(positive) * config.relative_margin
            tied |= bool((np.abs(candidates - threshold) < TIE).any())
        if config.absolute_margin is not None:
            tied |= bool((np.abs(candidates + config.absolute_margin - positive) < TIE).any())
        for bound in (config.max_score, config.min_score):
            if bound is not None:
                tied |= bool((np.abs(candidates - bound) < TIE).any())
        if tied:
            ambiguous.add(anchor)
    return ambiguous


@pytest.mark.slow  # the packaged MiniLM, loaded and run here and by sentence-transformers
@pytest.mark.parametrize(
    "settings",
    [
        dict(num_negatives=3, range_min=0, range_max=10, relative_margin=0.05),
        dict(num_negatives=2, range_min=2, range_max=8, relative_margin=None,
             absolute_margin=0.1),
        dict(num_negatives=4, range_min=1, range_max=12, relative_margin=0.3,
             absolute_margin=0.05),
        dict(num_negatives=5, range_min=0, range_max=5, relative_margin=0.0),
        # range_max null: derived as sentence-transformers does (range_min + 10·2 + p)
        dict(num_negatives=2, range_min=1, range_max=None, relative_margin=0.05),
        # max_score before range_min counts; min_score; both with a margin
        dict(num_negatives=3, range_min=1, range_max=10, relative_margin=None, max_score=0.45),
        dict(num_negatives=3, range_min=0, range_max=15, relative_margin=0.05, max_score=0.5,
             min_score=0.2),
    ],
)  # fmt: skip
def test_mined_pairs_are_sentence_transformers_negatives(minilm_pairs, settings):
    """The same (anchor, positive, negative) triplets as sentence-transformers'
    mine_hard_negatives with the same settings ("top" sampling, triplets with scores), negative
    by negative in order, and the same positive and negative scores; anchors whose result a
    near-tie decides (near_ties) are left out, and they are few."""
    data = minilm_pairs
    config = MiningConfig(
        embeddings=str(data["positives_out"]), anchors=str(data["anchors_out"]), exact=True,
        skip_same_document=False, **settings,
    )  # fmt: skip
    ours = mine_pairs(config)
    theirs = st_negatives(data, sampling_strategy="top", **settings)
    ambiguous = near_ties(data, config)
    assert len(ambiguous) <= 5, sorted(ambiguous)
    assert len(theirs) > 40  # most pairs get negatives: the comparison is not of empty sets
    keys = {k for k in ours.keys() | theirs.keys() if k[0] not in ambiguous}
    for key in sorted(keys):
        mine, reference = ours.get(key, []), theirs.get(key, [])
        assert [n for n, *_ in mine] == [n for n, *_ in reference], key
        assert np.allclose([s for _, *s in mine], [s for _, *s in reference], atol=1e-5), key
    # The anchor with two positives: one query, neither positive a negative of either pair,
    # and the same negatives for both.
    anchor = data["anchors"][1]
    both = {data["positives"][1], data["positives"][2]}
    for positive in both:
        assert not both & {n for n, *_ in ours.get((anchor, positive), [])}
    if anchor not in ambiguous:
        first, second = ([n for n, *_ in ours.get((anchor, p), [])] for p in sorted(both))
        assert first == second


def mine_pairs(config: MiningConfig, anchors_out=None, positives_out=None) -> dict:
    """{(anchor, positive): [(negative, positive score, negative score), ...]} of every pair,
    shard by shard in this process (the outputs: config.anchors and config.embeddings)."""
    anchors = read_manifest(str(anchors_out or config.anchors))
    positives = read_manifest(str(positives_out or config.embeddings))
    mined: dict[tuple[str, str], list] = {}
    for number in range(len(anchors.shards)):
        table, counts = mine_shard(positives, number, config, anchors)
        assert counts.pairs_without_positive == 0
        for row in table.to_pylist():
            key = (row["anchor"], row["positive"])
            mined.setdefault(key, []).append(
                (row["negative"], row["positive_score"], row["negative_score"])
            )
    return mined


def st_negatives(data: dict, **settings) -> dict:
    """The same, from sentence-transformers' mine_hard_negatives (triplets with scores)."""
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    mined = mine_hard_negatives(
        Dataset.from_dict({"anchor": data["anchors"], "positive": data["positives"]}),
        data["model"],
        anchor_column_name="anchor",
        positive_column_name="positive",
        output_format="triplet",
        output_scores=True,
        verbose=False,
        cache_folder=str(data["cache"]),
        **settings,
    )
    theirs: dict[tuple[str, str], list] = {}
    for row in mined:
        theirs.setdefault((row["anchor"], row["positive"]), []).append(
            (row["negative"], *row["scores"])
        )
    return theirs


@pytest.mark.slow  # the packaged MiniLM, run by sentence-transformers
@pytest.mark.parametrize(
    "settings",
    [
        dict(num_negatives=3, range_min=1, range_max=10, relative_margin=0.05, max_score=0.6),
        dict(num_negatives=4, range_min=0, range_max=12, relative_margin=None,
             absolute_margin=0.1, min_score=0.1),
    ],
)  # fmt: skip
def test_random_sampling_draws_what_sentence_transformers_allows(minilm_pairs, tmp_path, settings):
    """sampling_strategy "random": each anchor's negatives are among the candidates that
    sentence-transformers' filters allow (its "top" with num_negatives = range_max −
    range_min lists them all: same window, margins, max_score, min_score), as many as its own
    "random" draws (num_negatives, or all where fewer pass), most similar first; a rerun gives
    the same, so does the same seed with the anchors in 1 or 3 shards and the positives in 2
    (other tasks, other order of search), and another seed other negatives."""
    import random

    data = minilm_pairs
    config = MiningConfig(
        embeddings=str(data["positives_out"]), anchors=str(data["anchors_out"]), exact=True,
        skip_same_document=False, sampling_strategy="random", seed=11, **settings,
    )  # fmt: skip
    ours = mine_pairs(config)
    assert mine_pairs(config) == ours
    chosen = negatives_of(ours)
    vectors = np.stack([data["query_vectors"][a] for a in data["anchors"]])
    positives = np.stack([data["corpus_vectors"][p] for p in data["positives"]])
    write_embedding_output(tmp_path / "p2", positives, texts=data["positives"], shards=2)
    for shards in (1, 3):
        out = write_embedding_output(
            tmp_path / f"a{shards}", vectors, texts=data["anchors"], shards=shards
        )
        assert negatives_of(mine_pairs(config, out, tmp_path / "p2")) == chosen, shards
    reseeded = negatives_of(mine_pairs(dataclasses.replace(config, seed=12)))

    window = settings["range_max"] - settings["range_min"]
    every = st_negatives(data, sampling_strategy="top", **{**settings, "num_negatives": window})
    random.seed(0)  # sentence-transformers draws with Python's random
    drawn = st_negatives(data, sampling_strategy="random", **settings)
    ambiguous = near_ties(data, config)
    assert len(ambiguous) <= 5, sorted(ambiguous)
    keys = {k for k in ours.keys() | every.keys() if k[0] not in ambiguous}
    more_than_drawn = differs = 0
    for key in sorted(keys):
        allowed = {n: s for n, _, s in every.get(key, [])}
        mine, theirs = ours.get(key, []), drawn.get(key, [])
        assert {n for n, *_ in mine} <= allowed.keys(), key
        assert {n for n, *_ in theirs} <= allowed.keys(), key  # the allowed set is theirs
        assert len(mine) == len(theirs) == min(settings["num_negatives"], len(allowed)), key
        assert np.allclose([s for *_, s in mine], [allowed[n] for n, *_ in mine], atol=1e-5)
        assert [s for *_, s in mine] == sorted((s for *_, s in mine), reverse=True), key
        more_than_drawn += len(allowed) > settings["num_negatives"]
        differs += [n for n, *_ in mine] != [n for n, *_ in every.get(key, [])][: len(mine)]
    assert more_than_drawn > 20 and differs > 10  # a draw, not the top ones
    assert reseeded.keys() == chosen.keys() and reseeded != chosen


def test_p_is_the_most_rows_an_anchor_has_in_a_shard(ray_local, tmp_path):
    """p, what every pairs window adds to range_max, counted before the pass over every
    anchors' shard (in this process and as the Ray pass counts it): the most rows an anchor
    text has within one shard (a query's positives): 3 ("b"), then 2 once "c" has two rows in
    each shard (four in all)."""
    from distributed_emb.vectors.hard_negatives import _ray_most_positives, most_positives

    texts = ["a", "b", "b", "b", "c", "c", "c", "d", "e", "f"]
    rng = np.random.default_rng(1)
    out = write_embedding_output(tmp_path, unit(rng.normal(size=(10, 8))), texts, shards=2)
    anchors = read_manifest(str(out))
    assert [s.rows for s in anchors.shards] == [5, 5]
    config = MiningConfig(embeddings="unused", anchors=str(out))
    assert most_positives(anchors) == _ray_most_positives(anchors, config, [0, 1]) == 3
    texts[3] = "c"  # now "c" has two rows in the first shard and two in the second
    out = write_embedding_output(tmp_path / "2", unit(rng.normal(size=(10, 8))), texts, shards=2)
    assert most_positives(read_manifest(str(out))) == 2


def negatives_of(mined: dict) -> dict:
    """{(anchor, positive): [negative, ...]}: the texts only (scores computed over other
    shards may differ in the last float32 bit)."""
    return {key: [n for n, *_ in found] for key, found in mined.items()}


def pair_vectors(rows: int = 40, dim: int = 8, seed: int = 3):
    """(anchors, positives) unit vectors: each anchor close to its own positive (cosine about
    0.9), all of them random otherwise."""
    rng = np.random.default_rng(seed)
    positives = unit(rng.normal(size=(rows, dim)))
    anchors = unit(positives + 0.45 * unit(rng.normal(size=(rows, dim))))
    return anchors, positives


@pytest.fixture
def pair_outputs(tmp_path):
    """A pair table's two outputs; the positive of row 5 is missing from the positives' output
    (dropped when its column was read), so the pair has no positive score."""
    anchors, positives = pair_vectors()
    rows = len(anchors)
    ids = np.arange(rows) * 10 + 7
    kept = np.arange(rows) != 5
    anchors_out, positives_out = tmp_path / "anchors", tmp_path / "positives"
    write_embedding_output(anchors_out, anchors, [f"question {i}" for i in range(rows)], shards=2)
    write_embedding_output(
        positives_out, positives[kept], [f"answer {i}" for i in np.flatnonzero(kept)],
        ids=ids[kept], shards=3,
    )  # fmt: skip
    return anchors_out, positives_out, anchors, positives


def test_mining_job_writes_pairs_the_training_data_path_reads(ray_local, pair_outputs, tmp_path):
    """jobs/mine_negatives.py --anchors (random sampling, max_score): the Ray Data pass, one
    file per anchors' shard, each negative never the pair's positive, outside the relative
    margin of anchor · positive and not above max_score, the same as mine_shard's in this
    process (p and the draws do not depend on the task); summary.json records the settings;
    then the files read through the training data path with `data.kind=pairs
    data.negative_column=negative`: every row kept, its three texts the file's."""
    anchors_out, positives_out, anchors, positives = pair_outputs
    result = tmp_path / "mined"
    status = run_job(
        "mine_negatives",
        [str(positives_out), "--anchors", str(anchors_out), "--output", str(result),
         "--num-negatives", "2", "--range-max", "10", "--relative-margin", "0.1", "--exact",
         "--sampling-strategy", "random", "--seed", "4", "--max-score", "0.6"],
    )  # fmt: skip
    assert status == 0
    files = sorted(p.name for p in (result / "negatives").iterdir())
    assert files == [s.file.removeprefix("shards/") for s in read_manifest(anchors_out).shards]
    table = pq.read_table(result / "negatives")
    assert table.column_names[:4] == ["id", "anchor", "positive", "negative"]
    row = (table["id"].to_numpy() - 7) // 10
    negative = (table["negative_id"].to_numpy() - 7) // 10
    positive_score = np.sum(anchors[row] * positives[row], axis=1)
    negative_score = np.sum(anchors[row] * positives[negative], axis=1)
    assert 5 not in row and (row != negative).all()
    assert np.allclose(table["positive_score"].to_numpy(), positive_score, atol=1e-5)
    assert np.allclose(table["negative_score"].to_numpy(), negative_score, atol=1e-5)
    assert (negative_score <= positive_score - 0.1 * np.abs(positive_score) + 1e-6).all()
    assert (negative_score <= 0.6 + 1e-6).all()
    config = MiningConfig(
        embeddings=str(positives_out), anchors=str(anchors_out), exact=True, num_negatives=2,
        range_max=10, relative_margin=0.1, sampling_strategy="random", seed=4, max_score=0.6,
    )  # fmt: skip
    here = [
        mine_shard(read_manifest(str(positives_out)), n, config, read_manifest(str(anchors_out)))
        for n in range(2)
    ]
    assert table["negative_id"].to_pylist() == [
        i for t, _ in here for i in t["negative_id"].to_pylist()
    ]
    assert table["anchor"].to_pylist() == [f"question {i}" for i in row]
    assert table["positive"].to_pylist() == [f"answer {i}" for i in row]
    assert table["negative"].to_pylist() == [f"answer {i}" for i in negative]
    summary = json.loads((result / "summary.json").read_text())
    assert summary["pairs_without_positive"] == 1
    assert summary["anchors"] == len(anchors) and summary["negatives"] == len(table)
    assert summary["anchors_without_negative"] >= 1
    assert summary["removed_by_margin"] >= 1  # the margin removed something: it was measured
    assert summary["removed_above_max_score"] >= 1
    settings = summary["settings"]
    assert (settings["sampling_strategy"], settings["seed"], settings["max_score"]) == (
        "random",
        4,
        0.6,
    )
    assert (settings["min_score"], settings["window_range_max"], settings["max_positives"]) == (
        None,
        10,
        1,
    )

    data = DataConfig(path=str(result / "negatives"), kind="pairs", negative_column="negative")
    validate_negative_column(data, contrastive_weight=1.0)
    read = read_rows(data)
    assert (read[DROP] == "").all()
    for column in ("anchor", "positive", "negative"):
        assert sorted(read[column]) == sorted(table[column].to_pylist())


def read_rows(data: DataConfig) -> dict[str, np.ndarray]:
    """Every row the training data path reads from `data`, as it reads them (readers,
    cleaning rules, the columns of its kind), without Ray."""
    blocks = list(iter_parsed_blocks(resolve_sources(corpus_path(data)), text_rules(data)))
    return {
        name: np.concatenate([b.column(name).to_numpy(zero_copy_only=False) for b in blocks])
        for name in blocks[0].column_names
    }


def test_unlabelled_negatives_read_as_sentences_with_a_negative(tmp_path):
    """The unlabelled output keeps `text`, the column `data.kind=sentences` reads: with
    `data.negative_column=negative` every row is kept, text and negative as mined."""
    rng = np.random.default_rng(0)
    out = tmp_path / "embeddings"
    write_embedding_output(out, unit(rng.normal(size=(30, 8))), [f"row {i}" for i in range(30)])
    config = MiningConfig(embeddings=str(out), exact=True, num_negatives=2, range_max=5)
    table, _ = mine_shard(read_manifest(str(out)), 0, config)
    pq.write_table(table, tmp_path / "negatives.parquet")
    data = DataConfig(path=str(tmp_path / "negatives.parquet"), negative_column="negative")
    read = read_rows(data)
    assert len(table) > 0 and (read[DROP] == "").all()
    assert list(read["text"]) == table["text"].to_pylist()
    assert list(read["negative"]) == table["negative"].to_pylist()


def test_anchors_of_another_corpus_or_model_are_refused(pair_outputs, tmp_path):
    """A pair's anchor and positive are found by their shared id: the two outputs must come
    from one corpus (and one model); the check names the key."""
    anchors_out, positives_out, anchors, _ = pair_outputs
    other = tmp_path / "other"
    write_embedding_output(other, anchors, [f"q {i}" for i in range(len(anchors))])
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["corpus"] = ["another.jsonl"]
    (other / "manifest.json").write_text(json.dumps(manifest))
    config = MiningConfig(embeddings=str(positives_out), anchors=str(other), exact=True)
    with pytest.raises(ConfigError, match=r"anchors: .* has corpus \('another.jsonl',\)"):
        check_inputs(config)
    manifest["corpus"], manifest["model"] = ["corpus.jsonl"], "another-model"
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="has model 'another-model', embeddings 'unused-model'"):
        check_inputs(config)
    config = MiningConfig(embeddings=str(positives_out), anchors=str(anchors_out), exact=True)
    assert check_inputs(config)[1].rows == len(anchors)
