"""The ANN index settings (`index.*`): declared apart from vectors/ann_index.py so that
loading a config imports neither faiss nor Ray. Why these kinds and defaults: ann_index.py."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from distributed_emb.settings import section

# Below this many rows a shard's index is flat under kind=auto: a brute-force scan of 20k × 384
# floats takes about as long per query as an HNSW walk, needs no graph, and is exact.
FLAT_BELOW_ROWS = 20_000


@section
class IndexConfig:
    kind: Annotated[
        Literal["auto", "hnsw", "flat"],
        Field(
            description="each shard's index: hnsw (a graph, approximate), flat (a scan, exact), "
            "or auto (flat below index.flat_below_rows rows, else hnsw)"
        ),
    ] = "auto"
    flat_below_rows: Annotated[
        int, Field(ge=0, description="kind=auto: shards with fewer rows get a flat index")
    ] = FLAT_BELOW_ROWS
    # On the 9,782 MiniLM embeddings of the shipped news corpus (one shard), recall@10 at
    # efSearch 16: 0.993 with M = 32, 0.981 with M = 16; both ≥ 0.998 at efSearch 64.
    hnsw_m: Annotated[
        int, Field(ge=4, le=256, description="HNSW: neighbours per node (M) in the graph")
    ] = 32
    ef_construction: Annotated[
        int,
        Field(ge=8, description="HNSW: candidates kept while building (efConstruction)"),
    ] = 200
    ef_search: Annotated[
        int,
        Field(
            ge=1,
            description="HNSW: candidates kept per query (efSearch; at least k is used); "
            "stored in index.json as the search default",
        ),
    ] = 128
    cpus_per_task: Annotated[
        float,
        Field(
            gt=0,
            description="CPUs of each shard's build task when Ray is up (faiss threads: its "
            "whole part, at least 1)",
        ),
    ] = 1.0
