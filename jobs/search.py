"""Search an embedding output: the k nearest corpus rows of each query, across every shard.

    python jobs/search.py OUT [--query "text"] [--queries FILE] [-k 10] [--model DIR] \
        [--query-prompt TEXT] [--backend torch|onnx|onnx_int8] [--exact] [--ef-search N] \
        [--recall [--recall-sample N]] [--output FILE] [key=value ...]

OUT is what the embed job wrote (manifest.json, shards/, and index/ from its --index). The
queries (--query, once; --queries FILE: a .txt file, one a line, or a .jsonl file of objects
with "text", such as BEIR's queries.jsonl) are embedded with the manifest's model (--model
another) in this process, each shard's index is searched in turn and the answers are merged
by score; --exact scans every shard's vectors instead (the reference). Each query gives one
JSON line, {"query", ["query_id",] "results": [{"id", "score", "text"}, ...]}, printed or
written to --output. --recall also measures the index's recall@k against exact search, with
recall_sample corpus rows as queries (each one's own row left out). Scores are cosine
similarities. Queries are embedded as queries (sentence-transformers' encode_query): with
--query-prompt (prompts.query; "" for none), else the embed job's prompts.query (the
manifest's), else the model's own query prompt. Queries go through what embedded the corpus
(the manifest's backend: the torch model, or the ONNX graph embed.backend=onnx|onnx_int8 used,
which needs no torch model); --backend another is refused. Every setting: --help.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from distributed_emb.cli import Flag, Job, run_job
from distributed_emb.errors import UserInputError
from distributed_emb.model.model_config import require_model_dir
from distributed_emb.vectors.ann_index import read_index_info
from distributed_emb.vectors.search_config import SearchConfig
from distributed_emb.vectors.shard_layout import Manifest, read_manifest


def read_query_file(path: str) -> list[tuple[str | None, str]]:
    """(query id or None, text) of each query in a .txt (one a line, blank lines skipped) or
    .jsonl file (objects with "text" and an optional "_id"). Errors name the file and line."""
    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"{path}: no such query file")
    queries: list[tuple[str | None, str]] = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if file.suffix != ".jsonl":
            queries.append((None, line.strip()))
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserInputError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise UserInputError(f'{path}:{number}: expected an object with a "text" string')
        query_id = record.get("_id")
        queries.append((None if query_id is None else str(query_id), record["text"]))
    if not queries:
        raise UserInputError(f"{path}: no queries in it")
    return queries


def all_queries(config: SearchConfig) -> list[tuple[str | None, str]]:
    given = [(None, text) for text in config.queries]
    return given + (read_query_file(config.queries_file) if config.queries_file else [])


def check(config: SearchConfig) -> None:
    """Before any model loads: the manifest, the index (unless --exact), the queries, the
    backend (the manifest's), and the model directory or the corpus's graph."""
    manifest = read_manifest(config.embeddings)
    if not config.exact:
        read_index_info(manifest)
    all_queries(config)
    require_manifest_backend(config, manifest)
    if manifest.backend == "torch":
        require_model_dir(
            config.model or manifest.model, "model" if config.model else "manifest's model"
        )


def require_manifest_backend(config: SearchConfig, manifest: Manifest) -> None:
    """Queries are embedded by what embedded the corpus (the manifest's backend, through its
    graph for an ONNX backend): another backend, or another model for a graph, is refused."""
    if config.backend is not None and config.backend != manifest.backend:
        raise UserInputError(
            f"backend: {manifest.path} says the corpus was embedded with "
            f"embed.backend={manifest.backend}; its queries must be embedded the same way "
            f"(vectors of two backends differ slightly, and scores would mix them): use "
            f"--backend {manifest.backend}, or leave it out"
        )
    if manifest.backend != "torch" and config.model is not None:
        raise UserInputError(
            f"model: {manifest.path} was embedded with embed.backend={manifest.backend} "
            f"through the graph at {manifest.graph}; queries go through the same graph, so "
            "--model does not apply"
        )


def query_vectors(config: SearchConfig, manifest: Manifest, texts: list[str]):
    """(q, d) vectors of the query `texts`, embedded as queries by what embedded the corpus:
    the model (or --model), pooled and cut as the manifest says, or the manifest's ONNX graph;
    the query prompt is prompts.query, else the embed job's setting, else the model's own."""
    from distributed_emb.model.embedder import Embedder  # startup: torch
    from distributed_emb.storage import local_model_dir

    query_prompt = config.prompts.query
    if query_prompt is None:
        query_prompt = manifest.query_prompt
    if manifest.backend != "torch":  # the corpus's graph, as the embed job's actors ran it
        from distributed_emb.model.onnx_config import BACKEND_VARIANTS
        from distributed_emb.vectors.embed_backend import GraphEmbedder, graph_location

        graph = GraphEmbedder(
            graph_location(manifest.location, manifest.graph),
            BACKEND_VARIANTS[manifest.backend],
            batch_size=config.batch_size,
            max_seq_length=manifest.max_seq_length,
            query_prompt=query_prompt,
        )
        return graph.embed(texts, role="query")
    embedder = Embedder(
        local_model_dir(config.model or manifest.model),
        pooler=manifest.pooler,  # as the corpus was embedded (where the manifest says)
        max_seq_length=manifest.max_seq_length,
        batch_size=config.batch_size,
        query_prompt=query_prompt,
    )
    return embedder.embed(texts, role="query")


def run(config: SearchConfig) -> int:
    from distributed_emb.vectors.search import index_recall, search

    manifest = read_manifest(config.embeddings)
    lines = []
    queries = all_queries(config)
    if queries:
        vectors = query_vectors(config, manifest, [text for _, text in queries])
        found = search(
            manifest,
            vectors,
            config.k,
            exact=config.exact,
            ef_search=config.ef_search,
            with_text=True,
        )
        for i, (query_id, text) in enumerate(queries):
            hits = [
                {"id": int(row_id), "score": round(float(score), 6), "text": hit_text}
                for row_id, score, hit_text in zip(found.ids[i], found.scores[i], found.texts[i])
                if row_id >= 0
            ]
            line = {"query": text, **({"query_id": query_id} if query_id else {})}
            lines.append(json.dumps({**line, "results": hits}, ensure_ascii=False))
    if config.recall:
        recall = index_recall(
            manifest, config.recall_sample, config.k, config.seed, config.ef_search
        )
        sample = min(config.recall_sample, manifest.rows)
        lines.append(json.dumps({f"recall@{config.k}": round(recall, 4), "queries": sample}))
        print(
            f"recall@{config.k} of the index against exact search, {sample} corpus rows as "
            f"queries: {recall:.4f}",
            file=sys.stderr,
        )
    if config.output:
        Path(config.output).parent.mkdir(parents=True, exist_ok=True)
        Path(config.output).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        print(f"results written to {config.output}", file=sys.stderr)
    else:
        print("\n".join(lines))
    return 0


JOB = Job(
    description=__doc__.split("\n\n")[0],
    config_class=SearchConfig,
    default_config=None,
    check=check,
    run=run,
    uses_ray=lambda config: False,  # one process, one shard's index at a time
    log_dir=lambda config: None,
    output_key="output",
    flags=(
        Flag("embeddings", "the embedding output directory OUT", key="embeddings"),
        Flag("--query", "a query text", to_values=lambda text: {"queries": [text]}),
        Flag("--queries", "a .txt or .jsonl file of queries", key="queries_file"),
        Flag("-k", "results per query", key="k", type=int),
        Flag("--model", "the model that embeds the queries (default: the manifest's)", key="model"),
        Flag(
            "--backend",
            "torch, onnx or onnx_int8: must be the manifest's (the default)",
            key="backend",
        ),
        # Taken as given: "" (no prompt) too, which a key=value override reads as null.
        Flag("--query-prompt", "text put before each query ('' for none)", key="prompts.query"),
        Flag("--exact", "scan every shard's vectors instead of the index", key="exact", const=True),
        Flag("--ef-search", "HNSW candidates per query", key="ef_search", type=int),
        Flag(
            "--recall",
            "measure the index's recall@k against exact search",
            key="recall",
            const=True,
        ),
        Flag(
            "--recall-sample",
            "corpus rows drawn as queries for --recall",
            key="recall_sample",
            type=int,
        ),
    ),
)


if __name__ == "__main__":
    sys.exit(run_job(JOB))
