"""Evaluate a sentence encoder: 7 STS tasks, 7 SentEval transfer tasks, retrieval, geometry.

    python jobs/evaluate.py MODEL --senteval-data DIR --tasks all --output results.json \
        [--pooler cls|cls_before_pooler|mean] [--batch-size N] [--max-seq-len N] \
        [--no-ray] [--concurrency N] [--config YAML] [key=value ...]

MODEL is a SentenceTransformer directory (ours or anyone's; loads as saved unless --pooler is
given) or a plain HF encoder directory (--pooler picks the pooling; default
cls_before_pooler). --tasks takes a comma list of groups (sts, transfer, retrieval, geometry,
all) or task names (STS12 ... SICKRelatedness, MR ... MRPC). DIR is SentEval's
data/downstream (or its parent data/); it defaults to the shipped STS-B-only copy. When no
requested task has data in DIR the job stops before encoding, with status 2. Encoding runs
in this process on one machine (as SentenceTransformer.encode does, every core), and as a
Ray Data actor pool when joining a cluster (RAY_ADDRESS or ray.address) or with
--concurrency above 1; encode.use_ray=true forces the pool (a local Ray), --no-ray this
process.
Other settings (transfer.kfold, encode.concurrency, ...) as dotted overrides; see
docs/EVALUATION.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from distributed_emb.cli import Flag, Job, run_job
from distributed_emb.config import ConfigError, require_model_dir
from distributed_emb.evaluation import senteval_data as sd
from distributed_emb.evaluation.results_tables import format_results, write_results
from distributed_emb.evaluation.suite import (
    TASK_SPECS,
    EvaluationConfig,
    encodes_with_ray,
    evaluate,
    resolve_tasks,
)
from distributed_emb.paths import shipped_senteval_dir


def check_task_data(config: EvaluationConfig) -> None:
    """Point eval.senteval_dir at the task folders, and refuse a run with nothing to do.

    Before Ray starts: a DIR without any requested task's files used to skip every task and
    exit 0 with an empty results file.
    """
    given = config.eval.senteval_dir
    directory = sd.find_downstream_dir(given) if given else Path(shipped_senteval_dir())
    tasks = [task for group in resolve_tasks(config.eval.tasks).values() for task in group]
    try:
        present = [t for t in tasks if sd.task_present(directory, t, TASK_SPECS[t].needed)]
    except sd.SentEvalDataError as error:  # some of a task's files, not all: broken data
        raise ConfigError(f"eval.senteval_dir: {error}") from None
    if not present:
        where = given or "the shipped STS-B-only data (give --senteval-data DIR)"
        raise ConfigError(
            f"eval.senteval_dir: no data for any requested task ({', '.join(tasks)}) in {where}; "
            f"expected {sd.EXPECTED_LAYOUT}"
        )
    if given and directory != Path(given):
        print(f"SentEval data: using {directory}", file=sys.stderr)
        config.eval.senteval_dir = str(directory)


def config_source(args: argparse.Namespace, job: Job) -> tuple[str | None, list[str]]:
    """With no MODEL, the first word may be an override (`evaluate.py transfer.kfold=5`)."""
    overrides = list(args.overrides)
    if args.model and "=" in args.model and not Path(args.model).exists():
        overrides.insert(0, args.model)
        args.model = None
    return args.config, overrides


def check(config: EvaluationConfig) -> None:
    require_model_dir(config.model.path, "model.path")
    check_task_data(config)
    if config.output:  # the results file's directory, before hours of encoding
        Path(config.output).parent.mkdir(parents=True, exist_ok=True)


def run(config: EvaluationConfig) -> int:
    output = evaluate(config)
    print(format_results(output))
    if config.output:
        write_results(output, config.output)
        print(f"\nresults written to {config.output}")
    return 0


JOB = Job(
    description=__doc__.split("\n\n")[0],
    config_class=EvaluationConfig,
    default_config=None,
    config_source=config_source,
    check=check,
    run=run,
    uses_ray=encodes_with_ray,
    log_dir=lambda config: None,
    output_key="output",
    flags=(
        Flag("model", "model directory (default: packaged MiniLM)", key="model.path"),
        Flag("--senteval-data", "SentEval data/downstream directory", key="eval.senteval_dir"),
        Flag(
            "--tasks",
            "comma list: all, sts, transfer, retrieval, geometry, …",
            to_values=lambda text: {"eval.tasks": [text]},
        ),
        Flag("--pooler", "cls, cls_before_pooler or mean", key="encode.pooler"),
        Flag("--batch-size", "sentences per batch", key="encode.batch_size", type=int),
        Flag("--max-seq-len", "tokens per sentence", key="encode.max_seq_length", type=int),
        Flag("--no-ray", "encode in this process", key="encode.use_ray", const=False),
        Flag("--concurrency", "encoding actors", key="encode.concurrency", type=int),
    ),
)


if __name__ == "__main__":
    sys.exit(run_job(JOB))
