"""Fine-tune an encoder and its MCR² compression head end to end on Ray Train.

    python jobs/train_mcr2.py                 # first: heads on the frozen encoder
    python jobs/finetune_mcr2.py [--config jobs/configs/mcr2_finetune.yaml] [key=value ...]

The second step starts from the first's 64-d head (models/mcr2-64) and its training sentences
(training_sentences.parquet, document or IDC cluster per sentence) and trains every encoder
weight with the head under the MCR² objective (loss.mcr2: −R + R_c over each worker's batch,
the two dropout views as pairs, the starting encoder's in-batch neighbours kept). The same
training core as InforMin-CL (DDP, or DeepSpeed ZeRO with train.engine=deepspeed on GPUs),
so it scales out the same way; the best checkpoint by STS-B dev is exported, head included,
to outputs/mcr2_finetune/model. On a 2-core CPU this is slow: it is meant for GPUs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from distributed_emb.cli import Job, run_job
from distributed_emb.train import driver

JOB = Job(
    description=__doc__.splitlines()[0],
    default_config=Path(__file__).parent / "configs" / "mcr2_finetune.yaml",
    **driver.TRAINING_STEPS,
)


if __name__ == "__main__":
    sys.exit(run_job(JOB))
