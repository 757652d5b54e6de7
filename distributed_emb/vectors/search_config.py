"""The settings of jobs/search.py (top-k search over an embedding output), declared once."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated

from pydantic import Field

from distributed_emb.checks import ConfigError
from distributed_emb.model.model_config import PromptSettings
from distributed_emb.model.onnx_config import Backend
from distributed_emb.settings import Seed, section


@section
class SearchConfig:
    embeddings: Annotated[
        str | None,
        Field(description="the embedding output directory OUT (manifest.json, shards/, index/)"),
    ] = None
    queries: Annotated[
        list[str], Field(description="query texts (--query); embedded with the model")
    ] = field(default_factory=list)
    queries_file: Annotated[
        str | None,
        Field(
            description="more queries: a .txt file (one a line) or a .jsonl file of objects "
            "with 'text' (and '_id', as BEIR's queries.jsonl)"
        ),
    ] = None
    k: Annotated[int, Field(ge=1, description="results per query")] = 10
    model: Annotated[
        str | None,
        Field(description="the model that embeds the queries; null: the manifest's model"),
    ] = None
    batch_size: Annotated[int, Field(ge=1, description="queries embedded per batch")] = 128
    # The corpus's vectors and the queries' must come from one backend: the manifest's.
    backend: Annotated[
        Backend | None,
        Field(
            description="what embeds the queries: the manifest's backend (embed.backend: torch, "
            "or the corpus's ONNX graph); null: the manifest's; another is refused"
        ),
    ] = None
    # Queries are embedded as queries: prompts.query, else the embed job's (the manifest's),
    # else the model's own. prompts.document is not used (the corpus is embedded already).
    prompts: PromptSettings = field(default_factory=PromptSettings)
    exact: Annotated[
        bool,
        Field(description="a brute-force scan of every shard instead of the index (exact)"),
    ] = False
    ef_search: Annotated[
        int | None,
        Field(ge=1, description="HNSW candidates per query; null: the index's own (index.json)"),
    ] = None
    recall: Annotated[
        bool,
        Field(
            description="also measure the index's recall@k against exact search, with "
            "recall_sample corpus rows as queries (each one's own row left out)"
        ),
    ] = False
    recall_sample: Annotated[
        int, Field(ge=1, description="corpus rows drawn as queries for the recall")
    ] = 1000
    seed: Annotated[Seed, Field(description="which corpus rows the recall draws")] = 0
    output: Annotated[
        str | None,
        Field(description="a JSON-lines file for the results; null: print them"),
    ] = None

    def validate(self) -> None:
        if self.embeddings is None:
            raise ConfigError("embeddings: required: the embedding output directory to search")
        if not (self.queries or self.queries_file or self.recall):
            raise ConfigError(
                "queries: nothing to do: give --query TEXT, --queries FILE or --recall"
            )
        if self.recall and self.exact:
            raise ConfigError("recall: measures the index against exact search; drop --exact")
