"""Embed a corpus into Parquet shards with a Ray Data pool of encoding actors; resumable.

    python jobs/embed.py --output OUT [data.path=CORPUS] [model.path=MODEL] \
        [embed.backend=torch|onnx|onnx_int8] [embed.precision=float32|int8|ubinary] \
        [embed.concurrency=N] [embed.torch_threads=T] [--index] \
        [--document-prompt TEXT] [--query-prompt TEXT] [key=value ...]

CORPUS is anything the training job reads (a file, directory, glob, s3:// or gs:// URI, saved
or hub Hugging Face dataset), read, cleaned and counted the same way; default: the shipped
Wikipedia sentences. MODEL is a sentence-transformers directory (embeds as saved) or a plain
Hugging Face encoder (model.pooler on top); default: the packaged all-MiniLM-L6-v2. Each block
of embed.block_rows lines becomes OUT/shards/part-<first id>.parquet (id, embedding, text);
OUT/manifest.json is written last. Run it again into the same OUT after a failure and only the
blocks without a shard are embedded; OUT made with another model, corpus or setting is refused,
naming the key. --index also builds each shard's ANN index (OUT/index/, index.* settings) for
jobs/search.py and jobs/mine_negatives.py, and prints its recall@10 against exact search.
Corpus rows are documents: each is embedded as SentenceTransformer.encode_document embeds it,
with the model's document prompt, or --document-prompt TEXT ("" for none; prompts.document);
--query-prompt (prompts.query) is recorded in the manifest for jobs/search.py's queries.
The actors are laid out from the cluster, and the layout printed in one line: on one CPU node
one actor with every core as its threads, one per node on several, one per GPU
(vectors/embed_layout.py); embed.concurrency and embed.torch_threads override it.
embed.backend=onnx_int8 (or onnx, fp32) embeds through the model's exported ONNX graph with
onnxruntime (read from MODEL/onnx/, else exported once into embed.graph_cache, default
OUT/graphs/), refused when its agreement with the torch model fails the export's check; the
manifest records the backend and that agreement, and jobs/search.py embeds queries the same way.
Locally it starts Ray; on a cluster: ray job submit -- python jobs/embed.py ...
Every setting and its default: --help; the layout: distributed_emb/vectors/shard_layout.py.
"""

from __future__ import annotations

import sys

from distributed_emb.cli import Flag, Job, run_job
from distributed_emb.storage import is_remote, join
from distributed_emb.vectors.embed_config import EmbedJobConfig
from distributed_emb.vectors.embedding_settings import check_embed_job
from distributed_emb.vectors.shard_layout import MANIFEST


def computed_in_line(manifest: dict) -> str:
    """What the torch model multiplied in (embed.compute_dtype), and bfloat16's check."""
    line = f"computed in {' and '.join(manifest['compute_dtype'])}"
    check = manifest.get("precision_check")
    if check:
        line += (
            f" (bfloat16 against float32 on {check['rows']} texts: mean cosine "
            f"{check['mean_cosine']:.5f}, worst {check['worst_cosine']:.5f})"
        )
    return line


def run(config: EmbedJobConfig) -> int:
    from distributed_emb.tracking import logs_on_storage
    from distributed_emb.vectors.corpus_embedding import embed_corpus  # startup: torch
    from distributed_emb.vectors.embed_layout import cluster_layout

    layout = cluster_layout(config.embed)
    print(layout.line, flush=True)
    with logs_on_storage(config.embed.output_dir):  # an s3:// OUT keeps its run.log there
        result = embed_corpus(config, layout)
    rate = result.rows_embedded / max(result.seconds, 1e-9)
    print(
        f"embedded {result.rows_embedded} rows in {result.seconds:.0f} s ({rate:.0f} rows/s): "
        f"{result.shards_written} shards written, {result.shards_skipped} skipped (finished "
        f"earlier); {result.rows} rows in {len(result.manifest['shards'])} shards"
    )
    print(result.report.summary("corpus"))
    if result.manifest.get("compute_dtype"):
        print(computed_in_line(result.manifest), flush=True)
    print(f"manifest: {join(result.out, MANIFEST)}")
    if config.embed.index:
        build_and_measure_index(result.out, config)
    return 0


def build_and_measure_index(out: str, config: EmbedJobConfig) -> None:
    """The shards' ANN index (one Ray task per shard), then its recall@10 against exact search
    on corpus rows used as queries: what the approximation costs on this corpus."""
    from distributed_emb.vectors.ann_index import build_index
    from distributed_emb.vectors.search import index_recall
    from distributed_emb.vectors.shard_layout import read_manifest

    info = build_index(out, config.index)
    print(f"index: {len(info.shards)} shards ({config.index.kind}) under {join(out, 'index')}")
    recall = index_recall(read_manifest(out))
    print(f"index recall@10 against exact search: {recall:.4f}")


def log_dir(config: EmbedJobConfig) -> str | None:
    """run.log beside the shards, where OUT is a local directory."""
    out = config.embed.output_dir
    return None if out is None or is_remote(out) else out


JOB = Job(
    description=__doc__.split("\n\n")[0],
    config_class=EmbedJobConfig,
    default_config=None,
    check=check_embed_job,
    run=run,
    log_dir=log_dir,
    output_key="embed.output_dir",
    flags=(
        Flag("--index", "also build each shard's ANN index", key="embed.index", const=True),
        # Flags take their text as given: "" (no prompt) too, which an override reads as null.
        Flag("--document-prompt", "text put before each row ('' for none)", key="prompts.document"),
        Flag("--query-prompt", "text for search to put before each query", key="prompts.query"),
    ),
)


if __name__ == "__main__":
    sys.exit(run_job(JOB))
