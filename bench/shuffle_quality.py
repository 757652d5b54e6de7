"""How well an epoch's order mixes a corpus of shards: ours (distributed_emb/data/shuffle.py),
MosaicML Streaming's py1e, and a uniform permutation of the rows.

`python -m bench.shuffle_quality` prints a Markdown table; `--json` prints one JSON line.

Corpus: 16 shards of 100k rows, every row labelled with its shard; global batch 64, seed 0,
epoch 0. Each order is scored by
- labels_per_batch: mean number of distinct shard labels in each consecutive batch of 64 over
  the epoch (a uniform permutation gives about 16·(1 − (15/16)^64) ≈ 15.7; an order that
  trains one shard at a time, 1);
- order_correlation: |Spearman| between a row's position in the epoch and its row id (0: the
  epoch forgets the corpus order; 1: corpus order);
- single_file_order_correlation: the same on one file of the same 1.6M rows. Ours cuts that
  one shard into spans; py1e cannot cut a shard, so it gets the same rows as the 16 shards
  above (and the same value as its order_correlation).

py1e runs as Streaming runs it for one rank with one worker: `get_shuffle('py1e', …)` with
block size 2**18, read through `get_partitions('orig', …)`, which takes the canonical nodes'
samples in turn (so "py1e_8", 8 canonical nodes, interleaves 8 separate streams). It needs
`pip install --no-deps mosaicml-streaming`: every release of it requires transformers<5 and
numpy<2.2, which this project's own floors rule out, so it cannot be a dependency or an extra;
its shuffle and partition code needs numpy alone. Without it the py1e rows are left out.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from distributed_emb.data.shuffle import ShardOrder
from distributed_emb.tables import markdown_table

SHARDS = 16
SHARD_ROWS = 100_000
BATCH = 64
SEED = 0
EPOCH = 0
PY1E_BLOCK = 1 << 18  # Streaming's default shuffle_block_size


def _streaming_base(module: str) -> types.ModuleType:
    """mosaicml-streaming's `streaming.base.<module>`, loaded without the package's __init__.

    That __init__ imports Streaming's vision and text datasets (torchvision, transformers 4)
    and cloud clients, which a `--no-deps` install lacks; the shuffle and partition functions
    need numpy alone.
    """
    name = f"streaming.base.{module}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec("streaming")  # finds the package without running it
    root = Path(next(iter(spec.submodule_search_locations or []), "")) if spec else None
    if root is None or not (root / "base" / "shuffle" / "py1e.py").is_file():
        raise ImportError(
            "mosaicml-streaming is not installed: pip install --no-deps mosaicml-streaming"
        )
    stubs = [name for name in ("streaming", "streaming.base") if name not in sys.modules]
    for package in stubs:
        stub = types.ModuleType(package)
        stub.__path__ = [str(root if package == "streaming" else root / "base")]
        sys.modules[package] = stub
    try:
        return importlib.import_module(name)
    finally:
        for package in stubs:  # a later `import streaming` gets the real package
            del sys.modules[package]


def py1e_order(
    shard_rows: list[int], canonical_nodes: int, seed: int, epoch: int, block_size: int, batch: int
) -> np.ndarray:
    """Row ids in the order one rank with one worker trains them under Streaming's py1e."""
    shuffle = _streaming_base("shuffle").get_shuffle(
        "py1e", np.asarray(shard_rows, np.int64), canonical_nodes, seed, epoch, block_size
    )
    partitions = _streaming_base("partition").get_partitions(
        "orig", len(shuffle), canonical_nodes, 1, 1, 1, batch
    )  # (nodes, ranks, workers, batches, batch); -1 pads the last batch
    places = partitions.reshape(-1)
    return shuffle[places[places >= 0]]


def labels_per_batch(order: np.ndarray, shard_rows: list[int], batch: int) -> float:
    """Mean count of distinct shards among the rows of each whole consecutive batch."""
    shard_of_row = np.repeat(np.arange(len(shard_rows)), shard_rows)
    whole = len(order) // batch * batch
    labels = np.sort(shard_of_row[order[:whole]].reshape(-1, batch), axis=1)
    return float((1 + (np.diff(labels, axis=1) != 0).sum(axis=1)).mean())


def order_correlation(order: np.ndarray) -> float:
    """|Spearman| between epoch position and row id."""
    return float(abs(spearmanr(np.arange(len(order)), order).statistic))


def measure() -> dict[str, dict[str, float]]:
    shards = [SHARD_ROWS] * SHARDS
    ours = ShardOrder(tuple(shards), SEED, EPOCH)
    one_file = ShardOrder((sum(shards),), SEED, EPOCH)
    iid = np.random.default_rng(SEED).permutation(sum(shards))
    order = ours.rows(0, ours.total)
    result = {
        "ours": {
            "labels_per_batch": labels_per_batch(order, shards, BATCH),
            "order_correlation": order_correlation(order),
            "single_file_order_correlation": order_correlation(one_file.rows(0, one_file.total)),
        }
    }
    try:
        for name, nodes in (("py1e", 1), ("py1e_8", 8)):
            order = py1e_order(shards, nodes, SEED, EPOCH, PY1E_BLOCK, BATCH)
            correlation = order_correlation(order)
            result[name] = {
                "labels_per_batch": labels_per_batch(order, shards, BATCH),
                "order_correlation": correlation,
                "single_file_order_correlation": correlation,  # the same rows, as 16 shards
            }
    except ImportError as error:
        print(f"py1e left out: {error}", file=sys.stderr)
    result["iid"] = {
        "labels_per_batch": labels_per_batch(iid, shards, BATCH),
        "order_correlation": order_correlation(iid),
    }
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON line instead of a table")
    args = parser.parse_args(argv)
    result = measure()
    if args.json:
        print(json.dumps(result))
        return 0
    columns = [
        "order",
        f"shards per batch of {BATCH}",
        "|Spearman| position vs row id",
        "same, one 1.6M-row file",
    ]
    rows = [
        [
            name,
            f"{scores['labels_per_batch']:.2f}",
            f"{scores['order_correlation']:.4f}",
            f"{scores['single_file_order_correlation']:.4f}"
            if "single_file_order_correlation" in scores
            else "",
        ]
        for name, scores in result.items()
    ]
    print(markdown_table(columns, rows, right_aligned="-rrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
