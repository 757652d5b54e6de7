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

import yaml

from distributed_emb.checks import ConfigError
from distributed_emb.cli import Flag, Job, run_job
from distributed_emb.config import to_dict
from distributed_emb.data.corpus import check_small_corpus
from distributed_emb.train.driver import check_model_lengths, check_retrieval_data, check_storage
from distributed_emb.tune.search_config import SearchJobConfig

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "tune_default.yaml"
SAVED_CONFIG = "search_config.yaml"  # the search's full config, kept for --resume
EXIT_INTERRUPTED = 130


def config_source(args: argparse.Namespace, job: Job) -> tuple[str | None, list[str]]:
    """A new search: --config (or the default) and the overrides, into an --output that holds
    no search yet. --resume: the config saved in --output, nothing else."""
    if not args.resume:
        return args.config, list(args.overrides)
    if args.config != str(DEFAULT_CONFIG) or args.overrides or args.num_samples:
        raise ConfigError(
            "--resume continues the search with the config saved in its directory; "
            "drop --config, --num-samples and key=value overrides"
        )
    if not args.output:
        raise ConfigError("--resume needs --output DIR (the search to continue)")
    saved = Path(args.output) / SAVED_CONFIG
    if not saved.is_file():
        raise ConfigError(f"--resume: {saved} does not exist (no search started there)")
    # The directory may have moved since: it is where the search lives now (--output).
    return str(saved), []


def check(config: SearchJobConfig) -> None:
    """Before Ray starts: the storage, the corpus (listed; a small local one read), and a
    search already in --output (continued only with --resume)."""
    from distributed_emb.tune.driver import can_resume, search_paths

    check_storage(config)
    check_model_lengths(config)
    check_retrieval_data(config)
    check_small_corpus(config.data)  # listed; a small local one read, not counted
    paths = search_paths(config)
    if not config.tune.resume and can_resume(paths):
        raise ConfigError(
            f"{paths.output} already holds a search: add --resume to continue it, "
            "or choose another --output"
        )
    if config.tune.resume and not can_resume(paths):
        raise ConfigError(f"{paths.experiment} holds no Tune experiment to resume")


def run(config: SearchJobConfig) -> int:
    from distributed_emb.tracking import outputs_on_storage
    from distributed_emb.tune.driver import run_search, search_paths
    from distributed_emb.tune.search_report import format_summary, write_search_report

    paths = search_paths(config)
    if not config.tune.resume:
        (paths.output / SAVED_CONFIG).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    # With output.storage_path, the search's own log, tables, plots and best model also live
    # beside its Tune experiment, <storage>/<run name>/ (each trial's logs: driver.run_trial).
    with outputs_on_storage(config.output.storage_path, paths.name, paths.output):
        search = run_search(config, resume=config.tune.resume)
        summary = write_search_report(config, search)
    print(format_summary(summary))
    if search.interrupted:
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


JOB = Job(
    description="Hyperparameter search with Ray Tune.",
    config_class=SearchJobConfig,
    default_config=DEFAULT_CONFIG,
    config_source=config_source,
    check=check,
    run=run,
    state_api=True,  # Ray Train frees a stopped trial's placement group through it
    flags=(
        Flag("--num-samples", "trials (sets tune.num_samples)", key="tune.num_samples", type=int),
        Flag(
            "--resume",
            "continue the search already in --output, with the config saved there "
            "(sets tune.resume)",
            key="tune.resume",
            const=True,
        ),
    ),
)


if __name__ == "__main__":
    sys.exit(run_job(JOB))
