"""Query and document prompts, as sentence-transformers defines them, in every path: a tiny
model whose prompts change its vectors ("query: ", "passage: "), each path checked against
SentenceTransformer.encode_query / encode_document (the reference), and the settings that
override the prompts or switch them off (prompts.query, prompts.document)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from harness.tiny_run import tiny_beir_dir
from sentence_transformers import SentenceTransformer

from distributed_emb.model.embedder import Embedder, make_encoders
from distributed_emb.model.model_config import (
    PromptSettings,
    loaded_prompts,
    read_saved_prompts,
    role_prompt,
)

PROMPTS = {"query": "query: ", "document": "passage: "}
SENTENCES = [
    "A man is playing a guitar.",
    "Two dogs run through the snowy field.",
    "The stock market fell sharply today.",
]
ATOL = 1e-5


def _modules(bert_path: str, include_prompt: bool = True):
    from distributed_emb.model.sentence_transformer import _st_modules

    modules = _st_modules()
    transformer = modules.Transformer(bert_path, max_seq_length=64)
    pooling = modules.Pooling(
        transformer.get_embedding_dimension(), pooling_mode="mean", include_prompt=include_prompt
    )
    return [transformer, pooling]


def build_model(bert_path: str, prompts=None, default_prompt_name=None, include_prompt=True):
    return SentenceTransformer(
        modules=_modules(bert_path, include_prompt),
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        device="cpu",
    )


@pytest.fixture(scope="module")
def prompted(tiny_bert_path, tmp_path_factory) -> str:
    """The tiny BERT with mean pooling and the prompts {"query": "query: ", "document":
    "passage: "}, saved as a sentence-transformers directory."""
    directory = tmp_path_factory.mktemp("prompted") / "model"
    build_model(tiny_bert_path, PROMPTS).save(str(directory))
    return str(directory)


@pytest.fixture(scope="module")
def reference(prompted) -> SentenceTransformer:
    return SentenceTransformer(prompted, device="cpu")


def test_the_prompts_change_the_vectors(reference):
    """Else every comparison below would pass with the prompts ignored."""
    query = reference.encode_query(SENTENCES)
    document = reference.encode_document(SENTENCES)
    plain = reference.encode(SENTENCES)
    assert np.abs(query - document).max() > 1e-3
    assert np.abs(query - plain).max() > 1e-3 and np.abs(document - plain).max() > 1e-3


# --- the one resolver -------------------------------------------------------------------------

PROMPT_CASES = [
    (PROMPTS, None),
    ({"passage": "p: "}, None),  # encode_document's second name
    ({"corpus": "c: ", "classification": "x: "}, "classification"),
    ({"classification": "x: "}, "classification"),  # query/document "" win over the default
    (None, None),
]


@pytest.fixture(scope="module")
def bare(tiny_bert_path, tmp_path_factory) -> Path:
    """The tiny model saved with no prompts: each case below links its files and writes its
    own config_sentence_transformers.json."""
    directory = tmp_path_factory.mktemp("bare") / "model"
    build_model(tiny_bert_path).save(str(directory))
    return directory


@pytest.mark.parametrize("prompts, default", PROMPT_CASES)
def test_role_prompt_is_what_sentence_transformers_prepends(bare, tmp_path, prompts, default):
    saved = tmp_path / "saved"
    shutil.copytree(bare, saved, copy_function=lambda src, dst: Path(dst).symlink_to(src))
    config = json.loads((bare / "config_sentence_transformers.json").read_text())
    config.update(prompts=prompts or {}, default_prompt_name=default)
    (saved / "config_sentence_transformers.json").unlink()
    (saved / "config_sentence_transformers.json").write_text(json.dumps(config))
    model = SentenceTransformer(str(saved), device="cpu")
    # Read without loading, the saved config gives the loaded model's prompts.
    assert read_saved_prompts(str(saved)) == (model.prompts, model.default_prompt_name)
    methods = {"query": model.encode_query, "document": model.encode_document, None: model.encode}
    for role, method in methods.items():
        prompt = role_prompt(model.prompts, model.default_prompt_name, role)
        np.testing.assert_array_equal(model.encode(SENTENCES, prompt=prompt), method(SENTENCES))


def test_loaded_prompts_of_an_older_config_without_query_and_document_keys():
    assert loaded_prompts({"classification": "x: "}) == {
        "query": "",
        "document": "",
        "classification": "x: ",
    }
    assert role_prompt(loaded_prompts({"classification": "x: "}), "classification", "query") == ""
    assert role_prompt({"classification": "x: "}, "classification", "query") == "x: "
    with pytest.raises(ValueError, match="role must be one of"):
        role_prompt({}, None, "passage")


# --- Embedder (the torch path every job embeds through) ------------------------------------


def test_embedder_embeds_queries_and_documents_as_sentence_transformers(prompted, reference):
    embedder = Embedder(prompted, batch_size=2)
    assert embedder.prompt("query") == "query: " and embedder.prompt("document") == "passage: "
    np.testing.assert_allclose(
        embedder.embed(SENTENCES, role="query"), reference.encode_query(SENTENCES), atol=ATOL
    )
    np.testing.assert_allclose(
        embedder.embed(SENTENCES, role="document"),
        reference.encode_document(SENTENCES),
        atol=ATOL,
    )
    np.testing.assert_allclose(embedder.embed(SENTENCES), reference.encode(SENTENCES), atol=ATOL)
    as_documents = Embedder(prompted, embed_as="document")  # a pool's actors embed rows so
    np.testing.assert_allclose(
        as_documents({"text": np.array(SENTENCES)})["embedding"],
        reference.encode_document(SENTENCES),
        atol=ATOL,
    )


def test_prompt_settings_override_or_switch_off_the_models_prompts(prompted, reference):
    embedder = Embedder(prompted, query_prompt="", document_prompt="search_document: ")
    np.testing.assert_allclose(
        embedder.embed(SENTENCES, role="query"), reference.encode(SENTENCES), atol=ATOL
    )
    np.testing.assert_allclose(
        embedder.embed(SENTENCES, role="document"),
        reference.encode(SENTENCES, prompt="search_document: "),
        atol=ATOL,
    )


def test_make_encoders_gives_plain_query_and_document_encoders(prompted, reference):
    encoders = make_encoders(prompted, use_ray=False, document_prompt="")
    np.testing.assert_allclose(encoders.plain(SENTENCES), reference.encode(SENTENCES), atol=ATOL)
    query, document = encoders.pair
    np.testing.assert_allclose(query(SENTENCES), reference.encode_query(SENTENCES), atol=ATOL)
    np.testing.assert_allclose(
        document(SENTENCES), reference.encode(SENTENCES, prompt=""), atol=ATOL
    )


# --- BEIR evaluation ----------------------------------------------------------------------------


def _reference_scores(model, directory: Path, split: str, **prompts) -> dict[str, float]:
    """nDCG@10 and MRR@10 (× 100) of sentence-transformers' InformationRetrievalEvaluator."""
    from sentence_transformers.sentence_transformer.evaluation import (
        InformationRetrievalEvaluator,
    )

    def jsonl(name):
        return [json.loads(line) for line in (directory / name).read_text().splitlines()]

    corpus = {row["_id"]: row["text"] for row in jsonl("corpus.jsonl")}
    queries = {row["_id"]: row["text"] for row in jsonl("queries.jsonl")}
    relevant: dict[str, set[str]] = {}
    for line in (directory / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]:
        query, doc, score = line.split("\t")
        if int(score) >= 1:
            relevant.setdefault(query, set()).add(doc)
    evaluator = InformationRetrievalEvaluator(
        {q: queries[q] for q in relevant}, corpus, relevant, name="tiny", write_csv=False,
        score_functions={"cosine": _cosine}, **prompts,
    )  # fmt: skip
    scores = evaluator(model)
    return {
        "ndcg@10": 100 * scores["tiny_cosine_ndcg@10"],
        "mrr@10": 100 * scores["tiny_cosine_mrr@10"],
    }


def _cosine(a, b):
    from sentence_transformers.util import cos_sim

    return cos_sim(a, b)


@pytest.fixture(scope="module")
def beir_dir(tmp_path_factory) -> Path:
    return tiny_beir_dir(tmp_path_factory.mktemp("beir"))


def test_beir_search_sends_queries_and_documents_to_their_encoders(prompted, beir_dir):
    from distributed_emb.evaluation import beir

    seen: dict[str, list[str]] = {"query": [], "document": []}
    encoders = make_encoders(prompted, use_ray=False)

    def recording(role, encode):
        def record(texts):
            seen[role] += texts
            return encode(texts)

        return record

    (split,) = beir.read_splits(str(beir_dir), ["dev"])
    pair = (recording("query", encoders.query), recording("document", encoders.document))
    beir.search(pair, split, top_k=10, shard_size=16)
    assert seen["query"] == list(split.query_texts)
    assert seen["document"] == list(split.corpus_texts)


def test_beir_scores_of_a_prompted_model_equal_sentence_transformers(prompted, reference, beir_dir):
    from distributed_emb.evaluation import beir

    data = beir.read_splits(str(beir_dir), ["dev", "test"])
    ours = beir.score_splits(make_encoders(prompted, use_ray=False).pair, data)
    unprompted = beir.score_splits(make_encoders(prompted, use_ray=False).plain, data)
    for split in ("dev", "test"):
        expected = _reference_scores(reference, beir_dir, split)
        for metric in ("ndcg@10", "mrr@10"):
            assert ours[split]["metrics"][metric] == pytest.approx(expected[metric], abs=1e-4)
    # A plain encoder still scores (in-training evaluation, yardsticks): without prompts.
    assert unprompted["dev"]["metrics"] != ours["dev"]["metrics"]


def test_the_evaluation_job_applies_and_overrides_the_prompts(prompted, reference, beir_dir):
    from distributed_emb.evaluation.suite import EvaluationConfig, evaluate

    config = EvaluationConfig()
    config.model.path = prompted
    config.eval.retrieval_dir = str(beir_dir)
    config.eval.retrieval_splits = ["dev"]
    config.encode.use_ray = False
    output = evaluate(config)
    assert output["prompts"] == PROMPTS
    expected = _reference_scores(reference, beir_dir, "dev")
    for metric in ("ndcg@10", "mrr@10"):
        assert output["beir"]["dev"]["metrics"][metric] == pytest.approx(expected[metric], abs=1e-4)

    config.prompts = PromptSettings(query="", document=None)  # queries without a prompt
    output = evaluate(config)
    assert output["prompts"] == {"query": "", "document": "passage: "}
    expected = _reference_scores(reference, beir_dir, "dev", query_prompt="")
    for metric in ("ndcg@10", "mrr@10"):
        assert output["beir"]["dev"]["metrics"][metric] == pytest.approx(expected[metric], abs=1e-4)


# --- the embed job (corpus rows are documents) and search (queries) ---------------------------


def _embed_config(out: Path, model: str, *overrides: str):
    from harness.jobs import checked_config

    return checked_config("embed", ["--output", str(out), f"model.path={model}", *overrides])


@pytest.mark.parametrize(
    "argv, role, prompt",
    [
        ([], "document", "passage: "),  # the model's own document prompt
        (["--document-prompt", ""], "document", ""),  # switched off ("" as a flag gives it)
        (["--document-prompt", "search_document: "], "document", "search_document: "),
        (["embed.rows_as=query"], "query", "query: "),  # anchors for mining: as queries
        (["embed.rows_as=query", "--query-prompt", "q: "], "query", "q: "),
    ],
)
def test_embed_job_writes_document_vectors(prompted, reference, tmp_path, argv, role, prompt):
    """The job's pool options (from its config) make the actor that writes a shard: its rows
    are embedded as encode_document embeds them (or encode_query, embed.rows_as=query), with
    the prompt setting of that role when given."""
    from distributed_emb.vectors.corpus_embedding import BLOCK, PROMPT, ShardEmbedder
    from distributed_emb.vectors.corpus_embedding import _pool_options as pool_options
    from distributed_emb.vectors.embedding_settings import embedding_settings
    from distributed_emb.vectors.shard_writer import shard_location

    config = _embed_config(tmp_path / "out", prompted, *argv)
    pool = pool_options(config, prompted, None)
    assert pool["embed_as"] == role
    embedder_keys = (
        "model_path", "pooler", "batch_size", "max_seq_length", "normalize",
        "trust_remote_code", "embed_as", "query_prompt", "document_prompt",
    )  # fmt: skip
    actor = ShardEmbedder(
        out=str(tmp_path / "out"),
        precision="float32",
        ranges=None,
        write_text=True,
        **{key: pool[key] for key in embedder_keys},
    )
    batch = pa.table(
        {
            BLOCK: pa.array([1], pa.int64()),
            "rows": pa.array([3], pa.int64()),
            "ids": pa.array([[1, 2, 3]], pa.list_(pa.int64())),
            "texts": pa.array([SENTENCES], pa.list_(pa.string())),
            "embed": pa.array([True]),
        }
    )
    summary = actor(batch)
    assert summary.column(PROMPT).to_pylist() == [prompt]
    shard = pq.read_table(shard_location(str(tmp_path / "out"), 1))
    stored = np.stack(shard.column("embedding").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(stored, reference.encode(SENTENCES, prompt=prompt), atol=ATOL)
    if len(argv) < 2:  # the model's own prompt: what sentence-transformers' method gives
        method = reference.encode_query if role == "query" else reference.encode_document
        np.testing.assert_allclose(stored, method(SENTENCES), atol=ATOL)
    from distributed_emb.data.sources import resolve_sources

    files = resolve_sources(str(Path(prompted) / "modules.json"))  # any file: the settings
    settings = embedding_settings(config, files)
    assert settings["rows_as"] == (None if role == "document" else "query")
    assert settings[f"{role}_prompt"] == getattr(config.prompts, role)


def test_a_rerun_with_another_document_prompt_is_refused(tmp_path):
    from distributed_emb.vectors.embedding_settings import (
        OutputMismatchError,
        require_same_settings,
    )
    from distributed_emb.vectors.shard_writer import SETTINGS, write_json

    settings = {"document_prompt": None, "model": "m"}
    earlier = {key: None for key in _setting_names()} | settings
    write_json(str(tmp_path / SETTINGS), earlier)
    now = dict(earlier, document_prompt="passage: ")
    with pytest.raises(OutputMismatchError, match=r"^prompts\.document: .*=null.*=passage: "):
        require_same_settings(str(tmp_path), now)
    require_same_settings(str(tmp_path), earlier)  # the same settings: accepted


def _setting_names():
    from distributed_emb.vectors.embedding_settings import SETTING_KEYS

    return SETTING_KEYS


def _manifest(tmp_path: Path, model: str, prompts: dict | None):
    from distributed_emb.vectors.shard_layout import read_manifest

    tree = {
        "format": 1, "model": model, "dim": 32, "normalized": False, "dtype": "float32",
        "rows": 0, "shards": [], "rows_as": "document",
    }  # fmt: skip
    if prompts is not None:
        tree["prompts"] = prompts
    (tmp_path / "manifest.json").write_text(json.dumps(tree))
    return read_manifest(str(tmp_path))


@pytest.mark.parametrize(
    "setting, in_manifest, prompt",
    [
        (None, None, "query: "),  # the model's own query prompt
        ("", None, ""),  # switched off
        (None, {"query": "find: ", "document": None}, "find: "),  # the embed job's setting
        ("", {"query": "find: ", "document": None}, ""),  # the search's own setting first
    ],
)
def test_search_embeds_its_queries_as_queries(
    prompted, reference, tmp_path, setting, in_manifest, prompt
):
    from harness.jobs import job_module

    from distributed_emb.vectors.search_config import SearchConfig

    manifest = _manifest(tmp_path, prompted, in_manifest)
    assert manifest.query_prompt == (in_manifest or {}).get("query")
    assert manifest.rows_as == "document"
    config = SearchConfig(embeddings=str(tmp_path), queries=SENTENCES)
    config.prompts = PromptSettings(query=setting)
    vectors = job_module("search").query_vectors(config, manifest, SENTENCES)
    np.testing.assert_allclose(vectors, reference.encode(SENTENCES, prompt=prompt), atol=ATOL)
    if setting is None and in_manifest is None:
        np.testing.assert_allclose(vectors, reference.encode_query(SENTENCES), atol=ATOL)


@pytest.mark.parametrize(
    "argv, query, document",
    [
        (["--query-prompt", ""], "", None),  # a flag's text is taken as given: "" is none
        (["--query-prompt", "find: "], "find: ", None),
        (["prompts.query=find: ", "prompts.document=null"], "find: ", None),
        (["--document-prompt", "", "--query-prompt", "q: "], "q: ", ""),
    ],
)
def test_the_prompt_settings_from_the_command_line(tmp_path, argv, query, document):
    from harness.jobs import job_module

    from distributed_emb.cli import job_config

    if "--document-prompt" in argv:  # the embed job's flags (search has no documents)
        config = job_config(job_module("embed").JOB, ["--output", str(tmp_path), *argv])
    else:
        config = job_config(job_module("search").JOB, [str(tmp_path), "--query", "q", *argv])
    assert (config.prompts.query, config.prompts.document) == (query, document)


# --- export after training, and ONNX serving ----------------------------------------------


def test_an_export_keeps_the_given_models_prompts(prompted, reference, tmp_path):
    from transformers import AutoTokenizer

    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.model.export import export_sentence_transformer

    encoder = TrainableEncoder(prompted, pooler="mean", mlp_head=False)
    tokenizer = AutoTokenizer.from_pretrained(prompted)
    out = export_sentence_transformer(encoder, tokenizer, str(tmp_path / "export"), 64)
    saved = json.loads((Path(out) / "config_sentence_transformers.json").read_text())
    assert saved["prompts"] == PROMPTS and saved["default_prompt_name"] is None
    exported = SentenceTransformer(out, device="cpu")
    np.testing.assert_allclose(
        exported.encode_query(SENTENCES), reference.encode_query(SENTENCES), atol=ATOL
    )
    np.testing.assert_allclose(
        exported.encode_document(SENTENCES), reference.encode_document(SENTENCES), atol=ATOL
    )


@pytest.fixture(scope="module")
def onnx_prompted(prompted, tmp_path_factory) -> str:
    pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxruntime) is not installed")
    from distributed_emb.model.onnx_export import export_onnx

    directory = tmp_path_factory.mktemp("onnx") / "model"
    shutil.copytree(prompted, directory)
    export_onnx(directory, variants=("fp32",))
    return str(directory)


def test_onnx_serving_prepends_the_prompts(onnx_prompted, reference):
    from distributed_emb.model.onnx_embedder import OnnxEmbedder

    embedder = OnnxEmbedder(onnx_prompted, "fp32", batch_size=2)
    np.testing.assert_allclose(
        embedder.embed(SENTENCES, role="query"), reference.encode_query(SENTENCES), atol=1e-4
    )
    np.testing.assert_allclose(
        embedder.embed(SENTENCES, role="document"),
        reference.encode_document(SENTENCES),
        atol=1e-4,
    )
    np.testing.assert_allclose(embedder.embed(SENTENCES), reference.encode(SENTENCES), atol=1e-4)
    switched = OnnxEmbedder(onnx_prompted, "fp32", query_prompt="", document_prompt="d: ")
    np.testing.assert_allclose(
        switched.embed(SENTENCES, role="query"), reference.encode(SENTENCES), atol=1e-4
    )
    np.testing.assert_allclose(
        switched.embed(SENTENCES, role="document"),
        reference.encode(SENTENCES, prompt="d: "),
        atol=1e-4,
    )


def test_onnx_export_refuses_a_pooling_that_leaves_the_prompt_out(tiny_bert_path, tmp_path):
    pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxruntime) is not installed")
    from distributed_emb.model.onnx_export import UnexportableModelError, describe_graph_modules

    excluding = build_model(tiny_bert_path, PROMPTS, include_prompt=False)
    with pytest.raises(UnexportableModelError, match="include_prompt=False"):
        describe_graph_modules(excluding, tmp_path)
    # A default prompt alone is no longer refused: the server prepends it.
    with_default = build_model(tiny_bert_path, {"classification": "x: "}, "classification")
    assert describe_graph_modules(with_default, tmp_path) == ["Transformer", "Pooling(mean)"]
