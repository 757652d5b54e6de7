"""Train MCR² compression heads on a frozen sentence encoder and compare them with PCA, a
random projection and the uncompressed encoder.

    python jobs/train_mcr2.py [--config YAML] [--senteval-data DIR ...] [--output DIR] [key=value]

With no arguments: the packaged all-MiniLM-L6-v2 (mean pooling), the sentences of the shipped
Wikipedia articles and Lee news documents (clusters = documents) but for the fifth held out by
document (heldout.*, the hash every method uses), label-free similar pairs from InfoCSE's
intra-document clustering, heads for 64 and 128 dims, the best epoch by STS-B dev, evaluated on
the shipped STS-B, on the shipped news retrieval set (eval.retrieval_dir: nDCG@10 of its dev and
test splits) and on the held-out documents' yardstick (topic retrieval among their passages,
written to documents_eval/: nDCG@10 of its dev and test splits), each head against PCA and the
encoder with paired intervals. --senteval-data DIR [DIR ...] points the evaluation (and the
selection, from the first: the mean of STS-B dev and SICK-R dev where it holds SICK) at
SentEval data/downstream directories, which adds SICK-R, the transfer tasks and STS12–16 where
they hold them. eval.select_by=retrieval:<split> chooses each head's epoch by nDCG@10 on that
split of eval.retrieval_dir instead, documents:dev on the held-out documents' dev split (never
test). Every setting and its default: --help; see docs/MCR2.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

from distributed_emb.cli import Flag, Job, run_job
from distributed_emb.data.beir_layout import list_splits, read_splits
from distributed_emb.data.sources import resolve_sources
from distributed_emb.mcr2.compression_config import MCR2Config


def check(config: MCR2Config) -> None:
    """Before anything is encoded: the sentence and pair sources are listed (a missing file or
    bucket, an unreachable hub name fails here), and the retrieval splits scored are read (a
    malformed line is named by file and line, not after minutes of encoding)."""
    if config.sentences.paths:
        resolve_sources(config.sentences.paths, config.sentences.hf_split)
    if config.pairs.source == "file" and config.pairs.path:
        resolve_sources([config.pairs.path])
    directory = config.eval.retrieval_dir
    if directory is not None and "://" not in directory:
        read_splits(directory, config.eval.retrieval_splits or list_splits(directory))


def encodes_with_ray(config: MCR2Config) -> bool:
    """Decided once, here, with the cluster address the encoder's own settings do not hold:
    model.use_ray=auto becomes true or false (model/embedder.py use_encoding_pool)."""
    from distributed_emb.model.embedder import use_encoding_pool

    model = config.model
    model.use_ray = use_encoding_pool(model.use_ray, model.concurrency, config.ray.address)
    return model.use_ray


def run(config: MCR2Config) -> int:
    from distributed_emb.mcr2.comparison_report import weaker_than_given_lines
    from distributed_emb.mcr2.pipeline import run as run_pipeline  # startup: torch

    results = run_pipeline(config)
    timing = results["wall_time_s"]
    print()
    print(results["table_markdown"])
    print()
    print(
        f"wall time {timing['total_s']:.0f} s (encode {timing['encode_training_s']:.0f} s, "
        f"train {timing['train_heads_s']:.0f} s, evaluate {timing['evaluate_s']:.0f} s); "
        f"load average {results['load_average']['start']} → {results['load_average']['end']}"
    )
    for line in weaker_than_given_lines(results["intervals"]):  # reported, never chosen on
        print(line)
    print(f"results: {Path(config.output.dir) / 'results.json'} and results.md")
    for dim, path in results["exported_models"].items():
        print(f"model {dim}: {path}")
    return 0


JOB = Job(
    description=__doc__.split("\n\n")[0],
    config_class=MCR2Config,
    default_config=None,
    check=check,
    run=run,
    uses_ray=encodes_with_ray,
    flags=(
        Flag(
            "--senteval-data",
            "SentEval data/downstream directories: the first sets eval.senteval_dir (STS-B dev "
            "selection, evaluation), the others eval.extra_senteval_dirs (evaluation only, e.g. "
            "one with STS12-16)",
            nargs="+",
            to_values=lambda dirs: {
                "eval.senteval_dir": dirs[0],
                "eval.extra_senteval_dirs": list(dirs[1:]),
            },
        ),
    ),
)


if __name__ == "__main__":
    sys.exit(run_job(JOB))
