"""Do the faster ways the embed job can embed retrieve as well as the torch model in float32?
The int8 graph (embed.backend=onnx_int8) and the torch model in bfloat16 (embed.compute_dtype,
the default's choice on a CPU with AMX): nDCG@10 (and the other BEIR metrics) of each on a BEIR
directory, with the paired-bootstrap 95% interval of each difference from float32.

    python -m bench.backend_quality [--retrieval shipped:news] [--splits test] [--model DIR]

The packaged all-MiniLM-L6-v2 by default, copied to a scratch directory and exported there
(model/onnx_export.py, the graphs the embed job reads), then each split searched with queries
and corpus embedded by the torch model (model/embedder.py Embedder) in float32 and in
bfloat16, and by the int8 graph (model/onnx_embedder.py OnnxEmbedder, the embed job's actors'
embedder), scored by pytrec_eval and compared query by query with float32
(evaluation/comparison.py). Prints one JSON object.
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
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)

    directory = resolve_retrieval_dir(args.retrieval)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = Path(scratch) / "model"
        shutil.copytree(args.model or default_model_path(), model_dir)
        export_onnx(model_dir, variants=["fp32", "int8"])
        embedders = {
            "torch": Embedder(str(model_dir), batch_size=args.batch_size),
            "torch_bfloat16": Embedder(
                str(model_dir), batch_size=args.batch_size, compute_dtype="bfloat16"
            ),
            "onnx_int8": OnnxEmbedder(model_dir, "int8", batch_size=args.batch_size),
        }
        outputs = {
            name: evaluate_splits(_encoders(embedder), directory, args.splits)
            for name, embedder in embedders.items()
        }
    others = [name for name in outputs if name != "torch"]
    comparisons = {
        name: compare_results(
            {"model": "torch", "beir": outputs["torch"]}, {"model": name, "beir": outputs[name]}
        )
        for name in others
    }
    result = {
        "retrieval": args.retrieval,
        "splits": {
            split: {
                "n_queries": outputs["torch"][split]["n_queries"],
                **{name: outputs[name][split]["metrics"] for name in outputs},
                **{f"{name}_minus_torch": comparisons[name]["beir"][split] for name in others},
            }
            for split in args.splits
        },
        "not_compared": {name: comparisons[name]["not_compared"] for name in others},
    }
    print(json.dumps(result, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
