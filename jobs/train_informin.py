"""Train a sentence encoder with InforMin-CL on Ray Train.

    python jobs/train_informin.py [--config jobs/configs/X.yaml] [key=value ...] [--output DIR]

Locally with no cluster (starts Ray in-process) or on a cluster:
    ray job submit --working-dir . -- python jobs/train_informin.py --config ...
With no arguments: the packaged all-MiniLM-L6-v2, the shipped Wikipedia sentences, 2 workers.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout too

from distributed_emb.cli import training_job  # noqa: E402

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "informin_default.yaml"


def main(argv: list[str] | None = None) -> int:
    return training_job(argv, DEFAULT_CONFIG, "Train with InforMin-CL on Ray Train.")


if __name__ == "__main__":
    sys.exit(main())
