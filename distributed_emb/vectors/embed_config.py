"""The corpus embedding job's settings: its own section (`embed.*`), composed with the model,
data and Ray sections every job shares (`EmbedJobConfig`). Declared apart from
vectors/corpus_embedding.py so that loading and checking a config imports no torch."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from pydantic import Field

from distributed_emb.checks import ConfigError
from distributed_emb.data.data_config import DataConfig
from distributed_emb.model.compute_dtype import ComputeDtype
from distributed_emb.model.model_config import ModelConfig, PromptSettings
from distributed_emb.model.onnx_config import Backend
from distributed_emb.ray_config import RayConfig, validate_ray_config
from distributed_emb.settings import section
from distributed_emb.vectors.index_config import IndexConfig
from distributed_emb.watchdog import DEFAULT_STALL_TIMEOUT_S


@section
class EmbedConfig:
    output_dir: Annotated[
        str | None,
        Field(
            description="the embedding output directory OUT (local path, s3:// or gs://): "
            "shards/, manifest.json, calibration.npy; a rerun into it with the same model and "
            "corpus embeds only the blocks not yet written (required: --output)"
        ),
    ] = None
    block_rows: Annotated[
        int,
        Field(
            ge=1,
            description="corpus lines per block: one block is one shard, the unit that is "
            "embedded, written and skipped on a rerun",
        ),
    ] = 10_000
    # sentence-transformers' own default. On a 2-core Xeon, batches of 32 embedded faster than
    # 128 with every backend (float32 +18%, bfloat16 +24% on long documents, the int8 graph
    # +43% on sentences): a smaller batch's activations stay in the CPU's caches. A GPU wants
    # more: set it there.
    batch_size: Annotated[
        int,
        Field(
            ge=1,
            description="sentences per forward pass of an encoding actor (on a GPU, "
            "raise it: 128 or more)",
        ),
    ] = 32
    # vectors/embed_layout.py decides what is left null from the cluster: one actor using every
    # core on one CPU node, one per node on several, one per GPU.
    concurrency: Annotated[
        int | None,
        Field(
            ge=1,
            description="encoding actors (Ray Data pool); null: the layout the cluster gives "
            "(one actor on a single CPU node, one per node on several, one per GPU)",
        ),
    ] = None
    num_cpus_per_actor: Annotated[
        float | None,
        Field(
            gt=0,
            description="CPUs each encoding actor reserves; null: the layout's (its node's "
            "CPUs less one whole CPU left for the read tasks, shared by the actors there)",
        ),
    ] = None
    num_gpus_per_actor: Annotated[
        float | None,
        Field(
            ge=0,
            description="GPUs each encoding actor reserves; null: 1 when the cluster has a GPU "
            "for every actor (embed.backend=torch), else 0",
        ),
    ] = None
    torch_threads: Annotated[
        int | None,
        Field(
            ge=1,
            description="threads per actor (torch's, or onnxruntime's intra-op threads with "
            "an ONNX backend); null: the layout's (every core of the node, shared by the "
            "actors placed there)",
        ),
    ] = None
    backend: Annotated[
        Backend,
        Field(
            description="what embeds the rows: the torch model, or its exported ONNX graph "
            "through onnxruntime with no torch model in the actors: onnx (fp32) or onnx_int8 "
            "(int8 weights); the graph is read from the model's onnx/ folder or exported once "
            "into embed.graph_cache, and refused when its agreement with torch fails the "
            "export's check",
        ),
    ] = "torch"
    # model/compute_dtype.py: bfloat16 embedded 2.4-3x as fast on a CPU with AMX, at a cosine
    # of 0.99997 or more with float32; it is checked against float32 in every actor.
    compute_dtype: Annotated[
        ComputeDtype,
        Field(
            description="what the torch model multiplies in: float32; bfloat16 (autocast, "
            "checked against float32 on each actor's first texts and refused below a mean "
            "cosine of 0.999); auto: bfloat16 on a CPU with AMX (native bfloat16 matrix "
            "units), where it passes that check, else float32. The manifest records the "
            "choice and the check",
        ),
    ] = "auto"
    graph_cache: Annotated[
        str | None,
        Field(
            description="where graphs exported for an ONNX backend are kept, one folder per "
            "model (a digest of its files and pooler), reused by later runs; null: "
            "OUT/graphs/ (local path, s3:// or gs://: every actor reads it)",
        ),
    ] = None
    # model.max_seq_length is the training length (a speed choice), not the length to embed at.
    max_seq_length: Annotated[
        int | None,
        Field(
            ge=4,
            description="tokens per sentence (longer ones are cut); null: the model's own "
            "(model.max_seq_length, the training length, is not used here)",
        ),
    ] = None
    rows_as: Annotated[
        Literal["document", "query"],
        Field(
            description="embed each row as a document (SentenceTransformer.encode_document, "
            "prompts.document) or as a query (encode_query, prompts.query: the anchor column "
            "of a pair table, for jobs/mine_negatives.py --anchors)"
        ),
    ] = "document"
    normalize: Annotated[
        bool,
        Field(
            description="L2-normalise the vectors of a model that does not itself (one that "
            "ends in a Normalize module, as all-MiniLM-L6-v2, always gives unit vectors)"
        ),
    ] = False
    precision: Annotated[
        Literal["float32", "int8", "ubinary"],
        Field(
            description="stored vectors: float32; int8 (per-dimension ranges from a "
            "calibration sample, saved as calibration.npy); ubinary (one bit per dimension, "
            "packed in uint8): sentence-transformers' quantize_embeddings"
        ),
    ] = "float32"
    calibration_rows: Annotated[
        int,
        Field(
            ge=2,
            description="int8: the int8 ranges are the per-dimension min and max over the "
            "corpus's first N clean rows",
        ),
    ] = 10_000
    write_text: Annotated[
        bool, Field(description="store each row's text in its shard (a text column)")
    ] = True
    # Finite: a block that kills its actor every time (out of memory) must end the run, which
    # a rerun then resumes, rather than restart it forever.
    # The index is built after the manifest, one Ray task per shard (vectors/ann_index.py).
    index: Annotated[
        bool,
        Field(
            description="also build each shard's ANN index (OUT/index/, settings index.*) for "
            "jobs/search.py and jobs/mine_negatives.py"
        ),
    ] = False
    max_restarts: Annotated[
        int,
        Field(
            ge=0,
            description="times a dead encoding actor (killed, out of memory, node lost) is "
            "restarted, its unfinished blocks redone; then the run fails (a rerun resumes it)",
        ),
    ] = 3
    stall_timeout_s: Annotated[
        float | None,
        Field(
            gt=0,
            description="fail, naming what is missing, after waiting this long for resources "
            "that never free; null: wait",
        ),
    ] = DEFAULT_STALL_TIMEOUT_S


@section
class EmbedJobConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    # Corpus rows are documents (prompts.document; embed.rows_as=query: queries, prompts.query);
    # prompts.query is recorded in the manifest for jobs/search.py to embed queries with.
    prompts: PromptSettings = field(default_factory=PromptSettings)
    data: DataConfig = field(default_factory=DataConfig)
    embed: EmbedConfig = field(default_factory=EmbedConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def validate(self) -> None:
        """What the declarations cannot say: the job embeds one text a row, each kept row once,
        with the model as saved."""
        if self.data.kind != "sentences":
            raise ConfigError(
                f"data.kind: the embed job embeds one text a row (sentences), got "
                f"{self.data.kind!r}; embed a pair table's anchor and positive columns as two "
                "sentence corpora (data.text_column)"
            )
        if self.data.deduplicate:
            # Dropping a copy depends on rows in other blocks: a block would stop being a unit
            # that can be embedded and skipped alone.
            raise ConfigError(
                "data.deduplicate: not available to the embed job (every kept row is embedded, "
                "copies included, so that a block can be embedded alone); set it to false"
            )
        if self.data.negative_column is not None:
            raise ConfigError(
                "data.negative_column: the embed job embeds one text a row; set it to null"
            )
        if self.data.group_column is not None:
            raise ConfigError(
                "data.group_column: the embed job writes no group column; set it to null"
            )
        if self.model.compression_head is not None:
            raise ConfigError(
                "model.compression_head: the embed job embeds a saved model as it is; embed the "
                "model jobs/train_mcr2.py exported with its head (models/mcr2-<dim>)"
            )
        if self.embed.backend != "torch" and self.embed.compute_dtype == "bfloat16":
            raise ConfigError(
                f"embed.compute_dtype: bfloat16 is the torch model's; embed.backend="
                f"{self.embed.backend} runs the graph in its own format (set auto or float32)"
            )
        if self.embed.backend != "torch" and not _onnx_installed():
            raise ConfigError(
                f"embed.backend: {self.embed.backend} needs onnx and onnxruntime: "
                "pip install -e '.[onnx]' (or embed.backend=torch)"
            )
        validate_ray_config(self.ray)


def _onnx_installed() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxruntime"))
