"""Side by side at equal budget: SimCSE, InforMin-CL, InfoCSE self- and teacher-annotated, and
distillation from the teacher (distributed_emb/infocse/compare.py; docs/INFOCSE.md).

    python jobs/compare_infocse.py --output runs/compare [--arms simcse,infocse_self] [key=value]

The settings are the InfoCSE job's (jobs/configs/infocse_default.yaml) with a 3-layer student,
one round and the uncut model as the annotating teacher, plus compare.arms and
compare.informin_lambda. Writes compare.json and compare.md to the output directory, each
arm's difference from the start with its paired-bootstrap 95% interval included.
"""

from __future__ import annotations

import sys
from pathlib import Path

from distributed_emb.cli import Flag, Job, run_job
from distributed_emb.data.documents import check_small_documents
from distributed_emb.infocse import compare
from distributed_emb.storage_paths import require_writable
from distributed_emb.train import driver as train_driver

INFOCSE_DEFAULTS = Path(__file__).parent / "configs" / "infocse_default.yaml"


def run(config: compare.ComparisonConfig) -> int:
    rows = compare.run_comparison(
        config, Path(config.output.dir), list(config.compare.arms), config.compare.informin_lambda
    )
    print(compare.format_report(rows))
    return 0


def check(config: compare.ComparisonConfig) -> None:
    """Before Ray starts: the storage the arms' runs use, and the documents (listed; small
    local ones parsed)."""
    require_writable(config.output.storage_path, "output.storage_path")
    train_driver.check_model_lengths(config)
    train_driver.check_retrieval_data(config)
    train_driver.check_compression_head(config)
    check_small_documents(config.documents)


def config_source(args, job: Job) -> tuple[str | None, list[str]]:
    """The InfoCSE job's YAML (or --config), the comparison's own defaults, then the user's."""
    return args.config, [*compare.DEFAULTS, *args.overrides]


JOB = Job(
    description=__doc__.splitlines()[0],
    config_class=compare.ComparisonConfig,
    default_config=INFOCSE_DEFAULTS,
    config_source=config_source,
    check=check,
    run=run,
    flags=(
        Flag(
            "--arms",
            "comma list of arms (sets compare.arms)",
            to_values=lambda text: {"compare.arms": [a for a in text.split(",") if a]},
        ),
        Flag(
            "--informin-lambda",
            "λ of the informin arm (sets compare.informin_lambda)",
            key="compare.informin_lambda",
            type=float,
        ),
    ),
)


if __name__ == "__main__":
    sys.exit(run_job(JOB))
