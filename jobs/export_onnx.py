"""Export a sentence-transformers directory as one ONNX graph (fp32 and int8) and check it.

    python jobs/export_onnx.py MODEL_DIR [--variants fp32,int8] [--senteval-data DIR]
        [key=value ...]

MODEL_DIR is a sentence-transformers directory (one this project exported, or anyone's) holding
a Transformer, then Pooling, Dense, Normalize, LayerNorm or Dropout modules; a model with any
other module is refused, never exported without it. Writes MODEL_DIR/onnx/: model.onnx (fp32),
model_qint8.onnx (int8 weights), the tokenizer and export.json (the modules the graph holds,
the opset). Then embeds the STS-B dev sentences (the shipped copy unless --senteval-data) with
the torch model and with each graph, prints each variant's mean and worst cosine with torch and
each backend's STS-B dev Spearman, and records them in export.json under "backends". Exit
status 1 when a variant's mean cosine is below onnx.min_mean_cosine_<variant> (the files stay,
marked in export.json). Serve with distributed_emb.model.onnx_embedder.OnnxEmbedder. Needs the
onnx extra (pip install "distributed_emb[onnx]").
"""

from __future__ import annotations

import sys

from distributed_emb.cli import Flag, Job, comma_list, run_job
from distributed_emb.model.onnx_config import OnnxJobConfig


def check(config: OnnxJobConfig) -> None:
    """Before the model loads: a sentence-transformers directory whose onnx/ folder this job
    may write."""
    from distributed_emb.model.onnx_export import check_export_target

    check_export_target(config.model.path)


def run(config: OnnxJobConfig) -> int:
    from distributed_emb.model.onnx_export import export_onnx, write_export_info  # startup
    from distributed_emb.model.serving_check import below_minimum, format_backends, serving_check

    settings = config.onnx
    info = export_onnx(
        config.model.path,
        settings.variants,
        settings.opset,
        settings.int8_per_channel,
        settings.int8_reduce_range,
    )
    print(f"graph: {' → '.join(info['modules'])} (opset {info['opset']}, {info['dimension']} dims)")
    backends = serving_check(
        config.model.path,
        settings.variants,
        config.eval.senteval_dir,
        settings.stsb_pairs,
        settings.batch_size,
    )
    failures = below_minimum(
        backends,
        {"fp32": settings.min_mean_cosine_fp32, "int8": settings.min_mean_cosine_int8},
    )
    info["backends"] = backends
    info["check_passed"] = not failures
    path = write_export_info(config.model.path, info)
    print(format_backends(backends))
    print(f"written: {path.parent}")
    for line in failures:
        print(f"check failed: {line}; the graph is written but does not embed as the model does")
    return 1 if failures else 0


JOB = Job(
    description=__doc__.split("\n\n")[0],
    config_class=OnnxJobConfig,
    default_config=None,
    check=check,
    run=run,
    uses_ray=lambda config: False,
    log_dir=lambda config: None,
    flags=(
        Flag("model", "the sentence-transformers directory to export", key="model.path"),
        Flag(
            "--variants",
            "comma list of fp32, int8 (sets onnx.variants)",
            key="onnx.variants",
            type=comma_list,
        ),
        Flag(
            "--senteval-data",
            "SentEval data/downstream directory holding STS-B (default: the shipped copy)",
            key="eval.senteval_dir",
        ),
    ),
)


if __name__ == "__main__":
    sys.exit(run_job(JOB))
