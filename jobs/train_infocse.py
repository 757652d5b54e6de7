"""InfoCSE: mine positives by intra-document clustering with Ray actors, train, repeat.

    python jobs/train_infocse.py [--config jobs/configs/infocse_default.yaml] [key=value ...]

With no arguments (jobs/configs/infocse_default.yaml, about 9 minutes on 2 cores): a 3-layer
student of the packaged all-MiniLM-L6-v2 on the shipped Lee news + Wikipedia documents, round 1
mined by the full model, round 2 by the student, rounds chosen on held-out documents' retrieval
(dev half); the best round's model is exported to outputs/infocse/model and the per-round
table to outputs/infocse/rounds.md. With training.output.storage_path=s3://... the rounds'
state lives there and a rerun continues it (docs/INFOCSE.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distributed_emb.cli import setup_logging, start_ray  # noqa: E402
from distributed_emb.config import ConfigError, load_config  # noqa: E402

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "infocse_default.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--output", help="output directory (sets output_dir)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rounds.max_rounds=2")
    args = parser.parse_args(argv)
    from distributed_emb.infocse.config import InfoCSEConfig  # startup

    overrides = list(args.overrides) + ([f"output_dir={args.output}"] if args.output else [])
    try:
        config = load_config(InfoCSEConfig, args.config, overrides)
    except ConfigError as error:
        parser.exit(2, f"config error: {error}\n")
    setup_logging(config.output_dir)
    start_ray(config.training)
    from distributed_emb.infocse.rounds import format_table, run_rounds  # startup

    records = run_rounds(config)
    print(format_table(records))
    print(f"best model: {Path(config.output_dir) / 'model'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
