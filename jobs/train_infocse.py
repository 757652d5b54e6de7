"""InfoCSE: mine positives by intra-document clustering with Ray actors, train, repeat.

    python jobs/train_infocse.py [--config jobs/configs/infocse_default.yaml] [key=value ...]

With no arguments (jobs/configs/infocse_default.yaml): the packaged all-MiniLM-L6-v2, all of
its layers, trained on positives it mines itself from the shipped Lee news + Wikipedia
documents, rounds chosen on nDCG@10 on the dev split of the shipped news retrieval set; the
best round's model, the given one included, is exported to outputs/infocse/model (one line
says so when no round beat the given model) and the per-round table to
outputs/infocse/rounds.md. The student regime trains a cut of the model instead:
student.num_layers=3 annotation.model=source. With output.storage_path=s3://... the rounds'
state lives there and a rerun continues it, and the run's logs, table, plot and model reach
it as each round finishes (docs/INFOCSE.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from distributed_emb.cli import Job, run_job
from distributed_emb.data.documents import check_small_documents
from distributed_emb.infocse.rounds_config import InfoCSEConfig
from distributed_emb.storage_paths import require_writable
from distributed_emb.train import driver as train_driver


def check(config: InfoCSEConfig) -> None:
    """Before Ray starts: the storage the rounds live on, and the documents (listed; small
    local ones parsed)."""
    require_writable(config.output.storage_path, "output.storage_path")
    train_driver.check_model_lengths(config)
    train_driver.check_retrieval_data(config)
    train_driver.check_compression_head(config)
    check_small_documents(config.documents)


def run(config: InfoCSEConfig) -> int:
    from distributed_emb.infocse.round_export import exported_line  # torch
    from distributed_emb.infocse.round_records import format_table
    from distributed_emb.infocse.rounds import run_rounds
    from distributed_emb.selection import is_given_model

    records = run_rounds(config)
    print(format_table(records))
    exported = exported_line(records, config)
    if is_given_model(exported):  # the one line that says no round beat the given model
        print(exported)
    print(f"best model: {Path(config.output.dir) / 'model'}")
    return 0


JOB = Job(
    description=__doc__.splitlines()[0],
    config_class=InfoCSEConfig,
    default_config=Path(__file__).parent / "configs" / "infocse_default.yaml",
    check=check,
    run=run,
)


if __name__ == "__main__":
    sys.exit(run_job(JOB))
