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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout too

from distributed_emb.cli import setup_logging, start_ray  # noqa: E402
from distributed_emb.config import ConfigError, load_config, require_model_dir  # noqa: E402
from distributed_emb.evaluation import senteval_data as sd  # noqa: E402
from distributed_emb.evaluation.report import format_results, write_results  # noqa: E402
from distributed_emb.evaluation.suite import (  # noqa: E402
    TASK_SPECS,
    EvaluationConfig,
    encodes_with_ray,
    evaluate,
    resolve_tasks,
)
from distributed_emb.paths import shipped_senteval_dir  # noqa: E402


def check_task_data(config: EvaluationConfig) -> None:
    """Point config.senteval_dir at the task folders, and refuse a run with nothing to do.

    Before Ray starts: a DIR without any requested task's files used to skip every task and
    exit 0 with an empty results file.
    """
    given = config.senteval_dir
    directory = sd.find_downstream_dir(given) if given else Path(shipped_senteval_dir())
    tasks = [task for group in resolve_tasks(config.tasks).values() for task in group]
    try:
        present = [t for t in tasks if sd.task_present(directory, t, TASK_SPECS[t].needed)]
    except sd.SentEvalDataError as error:  # some of a task's files, not all: broken data
        raise ConfigError(f"senteval_dir: {error}") from None
    if not present:
        where = given or "the shipped STS-B-only data (give --senteval-data DIR)"
        raise ConfigError(
            f"senteval_dir: no data for any requested task ({', '.join(tasks)}) in {where}; "
            f"expected {sd.EXPECTED_LAYOUT}"
        )
    if given and directory != Path(given):
        print(f"SentEval data: using {directory}", file=sys.stderr)
        config.senteval_dir = str(directory)


def parse_args(argv: list[str] | None) -> EvaluationConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="model directory (default: packaged MiniLM)")
    parser.add_argument("--senteval-data", help="SentEval data/downstream directory")
    parser.add_argument("--tasks", help="comma list: all, sts, transfer, retrieval, geometry, …")
    parser.add_argument("--output", help="results JSON path")
    parser.add_argument("--pooler", choices=["cls", "cls_before_pooler", "mean"])
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--max-seq-len", type=int)
    parser.add_argument("--no-ray", action="store_true", help="encode in this process")
    parser.add_argument("--concurrency", type=int, help="encoding actors")
    parser.add_argument("--config", help="YAML with EvaluationConfig fields")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. transfer.kfold=5")
    # Intermixed: overrides may follow the flags (`MODEL --pooler mean transfer.kfold=5`).
    args = parser.parse_intermixed_args(argv)
    if args.model and "=" in args.model and not Path(args.model).exists():
        args.overrides.insert(0, args.model)  # no MODEL given: the first word is an override
        args.model = None
    try:
        config = load_config(EvaluationConfig, args.config, args.overrides)
        # Flags win over the YAML; set as values (not YAML-parsed) so paths stay strings.
        if args.model:
            config.model = args.model
        if args.senteval_data:
            config.senteval_dir = args.senteval_data
        if args.tasks:
            config.tasks = [args.tasks]
        if args.output:
            config.output = args.output
        if args.pooler:
            config.encode.pooler = args.pooler
        if args.batch_size is not None:
            config.encode.batch_size = args.batch_size
        if args.max_seq_len is not None:
            config.encode.max_seq_length = args.max_seq_len
        if args.no_ray:
            config.encode.use_ray = False
        if args.concurrency is not None:
            config.encode.concurrency = args.concurrency
        config.validate()
        require_model_dir(config.model, "model")
        check_task_data(config)
    except ConfigError as error:
        parser.exit(2, f"config error: {error}\n")
    return config


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    setup_logging(None)
    if encodes_with_ray(config):
        start_ray(config)  # reads only config.ray
    output = evaluate(config)
    print(format_results(output))
    if config.output:
        write_results(output, config.output)
        print(f"\nresults written to {config.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
