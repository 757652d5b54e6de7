"""Evaluate a sentence encoder: 7 STS tasks, 7 SentEval transfer tasks, retrieval, geometry.

    python jobs/evaluate.py MODEL --senteval-data DIR --tasks all --output results.json \
        [--pooler cls|cls_before_pooler|mean] [--batch-size N] [--max-seq-len N] \
        [--no-ray] [--concurrency N] [--config YAML] [key=value ...]

MODEL is a SentenceTransformer directory (ours or anyone's; loads as saved unless --pooler is
given) or a plain HF encoder directory (--pooler picks the pooling; default
cls_before_pooler). --tasks takes a comma list of groups (sts, transfer, retrieval, geometry,
all) or task names (STS12 ... SICKRelatedness, MR ... MRPC). DIR is SentEval's
data/downstream; it defaults to the shipped STS-B-only copy. Encoding runs as a Ray Data actor
pool (joins RAY_ADDRESS if set, else starts Ray locally); --no-ray encodes in this process.
Other settings (transfer.kfold, encode.concurrency, ...) as dotted overrides; see
docs/EVALUATION.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout too

from distributed_emb.cli import offline_defaults, setup_logging, start_ray  # noqa: E402
from distributed_emb.config import ConfigError, load_config  # noqa: E402
from distributed_emb.evaluation.report import format_results, write_results  # noqa: E402
from distributed_emb.evaluation.suite import EvaluationConfig, evaluate  # noqa: E402


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
    except ConfigError as error:
        parser.exit(2, f"config error: {error}\n")
    return config


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    offline_defaults()
    setup_logging(None)
    if config.encode.use_ray:
        start_ray(config)  # reads only config.ray
    output = evaluate(config)
    print(format_results(output))
    if config.output:
        write_results(output, config.output)
        print(f"\nresults written to {config.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
