"""Does the int8 graph the embed job can use (embed.backend=onnx_int8) retrieve as well as the
torch model it came from? nDCG@10 (and the other BEIR metrics) of both on a BEIR directory,
with the paired-bootstrap 95% interval of each difference.

    python -m bench.backend_quality [--retrieval shipped:news] [--splits test] [--model DIR]

The packaged all-MiniLM-L6-v2 by default, copied to a scratch directory and exported there
(model/onnx_export.py, the graphs the embed job reads), then each split searched with queries
and corpus embedded by the torch model (model/embedder.py Embedder) and by the int8 graph
(model/onnx_embedder.py OnnxEmbedder, the embed job's actors' embedder), scored by
pytrec_eval and compared query by query (evaluation/comparison.py). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

# First: importing it sets the jobs' environment defaults before the hub client is imported.
from distributed_emb.runtime import environment_defaults  # isort: skip
from distributed_emb.evaluation.beir import evaluate_splits
from distributed_emb.evaluation.comparison import compare_results
from distributed_emb.model.embedder import Embedder
from distributed_emb.model.onnx_embedder import OnnxEmbedder
from distributed_emb.model.onnx_export import export_onnx
from distributed_emb.paths import default_model_path, resolve_retrieval_dir


def _encoders(embedder) -> tuple:
    """(query encoder, document encoder) of an embedder with `embed(sentences, role)`."""
    return (
        lambda texts: embedder.embed(texts, role="query"),
        lambda texts: embedder.embed(texts, role="document"),
    )


def main(argv: list[str] | None = None) -> int:
    environment_defaults()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--retrieval", default="shipped:news", help="a BEIR directory")
    parser.add_argument("--splits", nargs="+", default=["test"])
    parser.add_argument("--model", default=None, help="default: the packaged MiniLM")
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args(argv)

    directory = resolve_retrieval_dir(args.retrieval)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = Path(scratch) / "model"
        shutil.copytree(args.model or default_model_path(), model_dir)
        export_onnx(model_dir, variants=["fp32", "int8"])
        outputs = {
            "torch": evaluate_splits(
                _encoders(Embedder(str(model_dir), batch_size=args.batch_size)),
                directory,
                args.splits,
            ),
            "onnx_int8": evaluate_splits(
                _encoders(OnnxEmbedder(model_dir, "int8", batch_size=args.batch_size)),
                directory,
                args.splits,
            ),
        }
    comparison = compare_results(
        {"model": "torch", "beir": outputs["torch"]},
        {"model": "onnx_int8", "beir": outputs["onnx_int8"]},
    )
    result = {
        "retrieval": args.retrieval,
        "splits": {
            split: {
                "n_queries": outputs["torch"][split]["n_queries"],
                "torch": outputs["torch"][split]["metrics"],
                "onnx_int8": outputs["onnx_int8"][split]["metrics"],
                "onnx_int8_minus_torch": comparison["beir"][split],
            }
            for split in args.splits
        },
        "not_compared": comparison["not_compared"],
    }
    print(json.dumps(result, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
