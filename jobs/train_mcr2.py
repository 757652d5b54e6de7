"""Train MCR² compression heads on a frozen sentence encoder and compare them with PCA, a
random projection and the uncompressed encoder.

    python jobs/train_mcr2.py [--config YAML] [--senteval-data DIR] [--output DIR] [key=value ...]

With no arguments: the packaged all-MiniLM-L6-v2 (mean pooling), every sentence of the shipped
Wikipedia articles and Lee news documents (clusters = documents), label-free similar pairs from
InfoCSE's intra-document clustering, heads for 64 and 128 dims, the best epoch by STS-B dev,
evaluated on the shipped STS-B. --senteval-data DIR [DIR ...] points the evaluation (and the
selection, from the first: the mean of STS-B dev and SICK-R dev where it holds SICK) at
SentEval data/downstream directories, which adds SICK-R, the transfer tasks and STS12–16
where they hold them. Every knob is in
jobs/configs/mcr2.yaml; see docs/MCR2.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout too

from distributed_emb.cli import setup_logging, start_ray  # noqa: E402
from distributed_emb.config import ConfigError, load_config  # noqa: E402
from distributed_emb.mcr2.config import MCR2Config  # noqa: E402
from distributed_emb.mcr2.pipeline import run  # noqa: E402
from distributed_emb.model.embedder import use_encoding_pool  # noqa: E402

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "mcr2.yaml"


def parse_args(argv: list[str] | None) -> MCR2Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="YAML (default: %(default)s)")
    parser.add_argument(
        "--senteval-data",
        nargs="+",
        help="SentEval data/downstream directories: the first sets eval.senteval_dir (STS-B "
        "dev selection, evaluation), the others eval.extra_senteval_dirs (evaluation only, "
        "e.g. one with STS12-16)",
    )
    parser.add_argument("--output", help="output directory (sets output_dir)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. output_dims=[32,256]")
    args = parser.parse_args(argv)
    try:
        config = load_config(MCR2Config, args.config, args.overrides)
        # Set as values, not YAML-parsed, so paths stay strings.
        if args.senteval_data:
            for directory in args.senteval_data:
                if not Path(directory).is_dir():
                    raise ConfigError(f"--senteval-data: {directory} is not a directory")
            config.eval.senteval_dir = args.senteval_data[0]
            config.eval.extra_senteval_dirs = list(args.senteval_data[1:])
        if args.output:
            config.output_dir = args.output
        config.validate()
    except ConfigError as error:
        parser.exit(2, f"config error: {error}\n")
    return config


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    setup_logging(config.output_dir)
    # Decided once, here, with the cluster address the encoder's own settings do not hold.
    encoder = config.encoder
    encoder.use_ray = use_encoding_pool(encoder.use_ray, encoder.concurrency, config.ray.address)
    if encoder.use_ray:
        start_ray(config)  # reads only config.ray
    results = run(config)
    timing = results["wall_time_s"]
    print()
    print(results["table_markdown"])
    print()
    print(
        f"wall time {timing['total_s']:.0f} s (encode {timing['encode_training_s']:.0f} s, "
        f"train {timing['train_heads_s']:.0f} s, evaluate {timing['evaluate_s']:.0f} s); "
        f"load average {results['load_average']['start']} → {results['load_average']['end']}"
    )
    print(f"results: {Path(config.output_dir) / 'results.json'} and results.md")
    for dim, path in results["exported_models"].items():
        print(f"model {dim}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
