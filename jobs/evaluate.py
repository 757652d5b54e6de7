"""Evaluate a sentence encoder: 7 STS tasks, 7 SentEval transfer tasks, retrieval, geometry.

    python jobs/evaluate.py MODEL --senteval-data DIR --tasks all --output results.json \
        [--retrieval BEIR_DIR [--retrieval-splits dev,test]] [--baseline MODEL2] \
        [--pooler cls|cls_before_pooler|mean] [--batch-size N] [--max-seq-len N] \
        [--no-ray] [--concurrency N] [--config YAML] [key=value ...]

MODEL is a SentenceTransformer directory (ours or anyone's; loads as saved unless --pooler is
given) or a plain HF encoder directory (--pooler picks the pooling; default
cls_before_pooler). --tasks takes a comma list of groups (sts, transfer, retrieval, geometry,
all) or task names (STS12 ... SICKRelatedness, MR ... MRPC). DIR is SentEval's
data/downstream (or its parent data/); it defaults to the shipped STS-B-only copy. When no
requested task has data in DIR the job stops before encoding, with status 2. BEIR_DIR is
the user's own retrieval data in the BEIR layout (corpus.jsonl, queries.jsonl,
qrels/<split>.tsv): every split there (or --retrieval-splits) is scored with nDCG@10, MAP@100,
R@10, R@100 and MRR@10; it is read and checked before any model loads, and given without
--tasks it is the only evaluation run. Encoding runs
in this process on one machine (as SentenceTransformer.encode does, every core), and as a
Ray Data actor pool when joining a cluster (RAY_ADDRESS or ray.address) or with
--concurrency above 1; encode.use_ray=true forces the pool (a local Ray), --no-ray this
process.
--baseline MODEL2 scores a second model on the same tasks with the same settings and prints,
per STS task and retrieval split, both scores and MODEL − MODEL2 with its paired-bootstrap 95%
interval (the items resampled; evaluation/comparison.py), also under "comparison" in the JSON.
Other settings (transfer.kfold, encode.concurrency, ...) as dotted overrides; see
docs/EVALUATION.md.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from distributed_emb.checks import ConfigError
from distributed_emb.cli import Flag, Job, comma_list, run_job
from distributed_emb.evaluation import beir
from distributed_emb.evaluation import senteval_data as sd
from distributed_emb.evaluation.comparison import compare_results, format_comparison
from distributed_emb.evaluation.results_tables import format_results, write_results
from distributed_emb.evaluation.suite import (
    TASK_SPECS,
    EvaluationConfig,
    beir_splits,
    encodes_with_ray,
    evaluate,
    senteval_tasks,
)
from distributed_emb.model.model_config import require_model_dir
from distributed_emb.paths import shipped_senteval_dir


def check_task_data(config: EvaluationConfig) -> None:
    """Point eval.senteval_dir at the task folders, and refuse a run with nothing to do.

    Before Ray starts: a DIR without any requested task's files used to skip every task and
    exit 0 with an empty results file.
    """
    given = config.eval.senteval_dir
    directory = sd.find_downstream_dir(given) if given else Path(shipped_senteval_dir())
    tasks = [task for group in senteval_tasks(config.eval).values() for task in group]
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


def check(config: EvaluationConfig) -> None:
    require_model_dir(config.model.path, "model.path")
    require_model_dir(config.eval.baseline_model, "eval.baseline_model")
    if senteval_tasks(config.eval):
        check_task_data(config)
    if config.eval.retrieval_dir:  # every file of every split read and checked, no model yet
        beir.read_splits(config.eval.retrieval_dir, beir_splits(config.eval))
    if config.output:  # the results file's directory, before hours of encoding
        Path(config.output).parent.mkdir(parents=True, exist_ok=True)


def compare_with_baseline(config: EvaluationConfig, output: dict) -> dict:
    """The baseline model (eval.baseline_model) scored on the same tasks with the same
    settings, and each of `output`'s STS tasks and retrieval splits against it."""
    baseline = copy.deepcopy(config)
    baseline.model.path = config.eval.baseline_model
    baseline.eval.baseline_model = None
    baseline.output = None
    return compare_results(evaluate(baseline), output)


def run(config: EvaluationConfig) -> int:
    output = evaluate(config)
    print(format_results(output))
    if config.eval.baseline_model:
        output["comparison"] = compare_with_baseline(config, output)
        print("\n" + format_comparison(output["comparison"]))
    if config.output:
        write_results(output, config.output)
        print(f"\nresults written to {config.output}")
    return 0


JOB = Job(
    description=__doc__.split("\n\n")[0],
    config_class=EvaluationConfig,
    default_config=None,
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
        Flag(
            "--retrieval",
            "a directory in the BEIR layout to score retrieval on",
            key="eval.retrieval_dir",
        ),
        Flag(
            "--retrieval-splits",
            "comma list of its qrels splits (default: all)",
            key="eval.retrieval_splits",
            type=comma_list,
        ),
        Flag(
            "--baseline",
            "a second model: each difference with its paired 95%% interval",
            key="eval.baseline_model",
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
