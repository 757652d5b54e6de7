"""Train a sentence encoder with InforMin-CL on Ray Train.

    python jobs/train_informin.py [--config jobs/configs/X.yaml] [key=value ...] [--output DIR]

Locally with no cluster (starts Ray in-process) or on a cluster:
    ray job submit --working-dir . -- python jobs/train_informin.py --config ...
With no arguments: the packaged all-MiniLM-L6-v2, the shipped Wikipedia sentences, 2 workers.
"""

from __future__ import annotations

import sys
from pathlib import Path

from distributed_emb.cli import Job, run_job
from distributed_emb.train import driver

JOB = Job(
    description="Train with InforMin-CL on Ray Train.",
    default_config=Path(__file__).parent / "configs" / "informin_default.yaml",
    **driver.TRAINING_STEPS,
)


if __name__ == "__main__":
    sys.exit(run_job(JOB))
