"""Search InforMin-CL's λ, β, learning rate and batch size with Ray Tune (docs/TUNE.md).

    python jobs/tune_informin.py [--config YAML] [--num-samples N] [--output DIR] [key=value ...]
    python jobs/tune_informin.py --output DIR --resume        # continue an interrupted search

Each trial is one run of the training job's own TorchTrainer; ASHA stops weak trials at
evaluation steps. DIR gets the results table (sorted by STS-B dev), the best config as a
YAML for jobs/train_informin.py, the best model and plots. With no arguments: a small search
on the packaged all-MiniLM-L6-v2 that fits a 2-core laptop (jobs/configs/tune_default.yaml).
On a cluster: ray job submit --working-dir . -- python jobs/tune_informin.py --config ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout too

import yaml  # noqa: E402

from distributed_emb.cli import setup_logging, start_ray  # noqa: E402
from distributed_emb.config import ConfigError, load_config, to_dict  # noqa: E402
from distributed_emb.tune.driver import can_resume, run_search, search_paths  # noqa: E402
from distributed_emb.tune.report import format_summary, write_search_report  # noqa: E402
from distributed_emb.tune.settings import SearchJobConfig  # noqa: E402

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "tune_default.yaml"
SAVED_CONFIG = "search_config.yaml"  # the search's full config, kept for --resume
EXIT_INTERRUPTED = 130


def parse_args(argv: list[str] | None) -> tuple[SearchJobConfig, bool]:
    parser = argparse.ArgumentParser(description="Hyperparameter search with Ray Tune.")
    parser.add_argument("--config", help=f"search YAML (default: {DEFAULT_CONFIG})")
    parser.add_argument("--num-samples", type=int, help="trials (sets tune.num_samples)")
    parser.add_argument("--output", help="output directory (sets output.dir)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the search already in --output, with the config saved there",
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.max_steps=30")
    args = parser.parse_args(argv)
    try:
        if args.resume:
            if args.config or args.overrides or args.num_samples:
                raise ConfigError(
                    "--resume continues the search with the config saved in its directory; "
                    "drop --config, --num-samples and key=value overrides"
                )
            if not args.output:
                raise ConfigError("--resume needs --output DIR (the search to continue)")
            saved = Path(args.output) / SAVED_CONFIG
            if not saved.is_file():
                raise ConfigError(f"--resume: {saved} does not exist (no search started there)")
            # The directory may have moved since: it is where the search lives now.
            config = load_config(SearchJobConfig, str(saved), [f"output.dir={args.output}"])
        else:
            overrides = list(args.overrides)
            if args.num_samples is not None:
                overrides.append(f"tune.num_samples={args.num_samples}")
            if args.output:
                overrides.append(f"output.dir={args.output}")
            config = load_config(SearchJobConfig, args.config or str(DEFAULT_CONFIG), overrides)
            paths = search_paths(config)
            if can_resume(paths):
                raise ConfigError(
                    f"{paths.output} already holds a search: add --resume to continue it, "
                    "or choose another --output"
                )
    except ConfigError as error:
        parser.exit(2, f"config error: {error}\n")
    return config, args.resume


def main(argv: list[str] | None = None) -> int:
    config, resume = parse_args(argv)
    paths = search_paths(config)
    setup_logging(str(paths.output))
    if not resume:
        (paths.output / SAVED_CONFIG).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    if resume and not can_resume(paths):
        print(f"{paths.experiment} holds no Tune experiment to resume", file=sys.stderr)
        return 2
    start_ray(config, state_api=True)
    try:
        run = run_search(config, resume=resume)
    except ConfigError as error:  # e.g. a searched batch size larger than the corpus allows
        print(f"config error: {error}", file=sys.stderr)
        return 2
    summary = write_search_report(config, run)
    print(format_summary(summary))
    if run.interrupted:
        print(
            f"\nThe search was interrupted. Continue it with:\n"
            f"    python {sys.argv[0]} --output {paths.output} --resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if summary["best_trial"] is None:
        print("no trial produced a score (see the table's error column)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
