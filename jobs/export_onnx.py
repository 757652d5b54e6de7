"""Export a sentence-transformers directory as one ONNX graph (fp32 and int8) and check it.

    python jobs/export_onnx.py MODEL_DIR [--variants fp32,int8] [--senteval-data DIR]
        [--output OUT] [key=value ...]

MODEL_DIR is a sentence-transformers directory (one this project exported, or anyone's) holding
a Transformer, then Pooling, Dense, Normalize, LayerNorm or Dropout modules; a model with any
other module is refused, never exported without it. Writes MODEL_DIR/onnx/: model.onnx (fp32),
model_qint8.onnx (int8 weights), the tokenizer and export.json (the modules the graph holds,
the opset). Then embeds the STS-B dev sentences (the shipped copy unless --senteval-data) with
the torch model and with each graph, prints each variant's mean and worst cosine with torch and
each backend's STS-B dev Spearman, and records them in export.json under "backends". Exit
status 1 when a variant's mean cosine is below onnx.min_mean_cosine_<variant> (the files stay,
marked in export.json). --output OUT exports a copy instead: MODEL_DIR is copied to OUT (new or
empty) and the files go into OUT/onnx/, MODEL_DIR left as it is (a read-only or installed
model). Serve with distributed_emb.model.onnx_embedder.OnnxEmbedder. Needs the onnx extra
(pip install "distributed_emb[onnx]").
"""

# No `from __future__ import annotations`: the settings below are declared in this script, which
# the tests load without a sys.modules entry, where string annotations could not be resolved.
import shutil
import sys
from dataclasses import field
from pathlib import Path
from typing import Annotated

from pydantic import Field

from distributed_emb.atomic_files import staged_directory
from distributed_emb.checks import ConfigError
from distributed_emb.cli import Flag, Job, comma_list, run_job
from distributed_emb.errors import UserInputError
from distributed_emb.model.onnx_config import OnnxJobConfig
from distributed_emb.model.sentence_transformer import is_sentence_transformer_dir
from distributed_emb.settings import section


@section
class ExportCopyConfig:
    dir: Annotated[
        str | None,
        Field(
            description="export a copy: MODEL_DIR is copied into this new or empty directory and "
            "the ONNX files go into its onnx/ folder, MODEL_DIR left as it is; null: into "
            "MODEL_DIR's own onnx/ folder"
        ),
    ] = None


@section
class ExportJobConfig(OnnxJobConfig):
    """The export's settings (model/onnx_config.py) and where this job writes (--output)."""

    output: ExportCopyConfig = field(default_factory=ExportCopyConfig)


def check(config: ExportJobConfig) -> None:
    """Before the model loads: a sentence-transformers directory whose onnx/ folder this job
    may write, or, with --output, one it may copy into a new or empty directory."""
    from distributed_emb.model.onnx_export import check_export_target

    if config.output.dir is None:
        check_export_target(config.model.path)
        return
    model, out = Path(config.model.path).resolve(), Path(config.output.dir).resolve()
    if not is_sentence_transformer_dir(model):
        raise UserInputError(
            f"{config.model.path}: not a sentence-transformers directory (no modules.json); the "
            "ONNX export reads the modules the model embeds with"
        )
    if out == model or model in out.parents:
        raise ConfigError(f"output.dir: {config.output.dir} is inside model.path; choose another")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(
            f"output.dir: {config.output.dir} is not an empty directory (the model is copied "
            "into a new or empty one)"
        )


def export_dir(config: ExportJobConfig) -> str:
    """The directory the export writes into: MODEL_DIR, or its copy in output.dir (made
    whole, without MODEL_DIR's own onnx/ folder, or not at all)."""
    if config.output.dir is None:
        return config.model.path
    from distributed_emb.model.onnx_files import ONNX_DIR

    source = Path(config.model.path)
    with staged_directory(config.output.dir) as staged:
        shutil.copytree(
            source,
            staged,
            ignore=lambda folder, names: [ONNX_DIR] if Path(folder) == source else [],
            dirs_exist_ok=True,
        )
    return config.output.dir


def run(config: ExportJobConfig) -> int:
    from distributed_emb.model.onnx_export import export_onnx  # startup
    from distributed_emb.model.onnx_files import write_export_info
    from distributed_emb.model.serving_check import below_minimum, format_backends, serving_check

    settings = config.onnx
    model_dir = export_dir(config)
    info = export_onnx(
        model_dir,
        settings.variants,
        settings.opset,
        settings.int8_per_channel,
        settings.int8_reduce_range,
    )
    print(f"graph: {' → '.join(info['modules'])} (opset {info['opset']}, {info['dimension']} dims)")
    backends = serving_check(
        model_dir,
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
    path = write_export_info(model_dir, info)
    print(format_backends(backends))
    print(f"written: {path.parent}")
    for line in failures:
        print(f"check failed: {line}; the graph is written but does not embed as the model does")
    return 1 if failures else 0


JOB = Job(
    description=__doc__.split("\n\n")[0],
    config_class=ExportJobConfig,
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
