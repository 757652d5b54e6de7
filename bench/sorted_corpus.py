"""The default job on a corpus sorted by source: the corpus's own order against the shuffled
order every run trains in, measured on held-out STS.

    python -m bench.sorted_corpus --documents A.jsonl B.jsonl --senteval-data DIR \
        [--workdir /tmp/distributed_emb_sorted_corpus] [--json]

The corpus is one text file holding every document's sentences, source after source and
document after document, the way a corpus concatenated from several sources or exported
article by article arrives (`--documents`: JSONL files of {"sentences": [...]}, in order).
The default job (jobs/configs/informin_default.yaml) trains on it twice, everything equal but
the order:

- "corpus": `data.shuffle_seed=null`, the corpus's own order (no shuffling): the file is
  trained source after source, as an unshuffled reader would;
- "shuffled": the default (`data.shuffle_seed=0`), spans of the whole corpus permuted and rows
  shuffled in windows (data/shuffle.py).

Then `jobs/evaluate.py SHUFFLED --baseline CORPUS --tasks sts` scores both on every STS task of
`--senteval-data` (none of them seen in training) with each difference's paired 95% interval.
Prints a markdown table (or one JSON line with `--json`): per task, both Spearmans and the
difference with its interval, plus where each run's first 1,000 training rows came from
(sources seen), read from the runs' row logs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from distributed_emb.evaluation.paired_bootstrap import PairedDifference
from distributed_emb.tables import markdown_table

REPO = Path(__file__).resolve().parents[1]
ORDERS = {"corpus": "null", "shuffled": "0"}  # data.shuffle_seed


def write_sorted_corpus(documents: list[Path], path: Path) -> list[int]:
    """The sentences of every document, source after source; returns the line where each
    source starts (and the total after the last)."""
    starts, lines = [], []
    for source in documents:
        starts.append(len(lines))
        for line in source.read_text().splitlines():
            if line.strip():
                lines.extend(s for s in json.loads(line)["sentences"] if s.strip())
    starts.append(len(lines))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return starts


def train(corpus: Path, output: Path, shuffle_seed: str) -> dict:
    """The default job on `corpus` with one order; its metrics.json."""
    if not (output / "metrics.json").exists():
        subprocess.run(
            [sys.executable, str(REPO / "jobs" / "train_informin.py"), f"data.path={corpus}",
             f"data.shuffle_seed={shuffle_seed}", "output.row_log=true",
             "eval.test_after_training=false", "--output", str(output), "--overwrite"],
            check=True,
        )  # fmt: skip
    return json.loads((output / "metrics.json").read_text())


def first_rows_by_source(output: Path, starts: list[int], rows: int = 1000) -> list[int]:
    """How many of the first `rows` trained rows came from each source (row ids of a text
    file are its line numbers, data/readers.py)."""
    from distributed_emb.data.readers import FILE_BITS

    trained = []
    for log in sorted((output / "trained_rows").glob("rank*.jsonl")):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            trained.extend((record["step"], i, r) for i, r in enumerate(record["rows"]))
    lines = [r & ((1 << FILE_BITS) - 1) for _, _, r in sorted(trained)[:rows]]
    return [sum(a <= x < b for x in lines) for a, b in zip(starts, starts[1:])]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", nargs="+", type=Path, required=True)
    parser.add_argument("--senteval-data", required=True)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/distributed_emb_sorted_corpus"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    corpus = args.workdir / "sorted_corpus.txt"
    starts = write_sorted_corpus(args.documents, corpus)
    runs = {name: args.workdir / name for name in ORDERS}
    metrics = {name: train(corpus, runs[name], seed) for name, seed in ORDERS.items()}
    comparison_file = args.workdir / "shuffled_vs_corpus.json"
    subprocess.run(
        [sys.executable, str(REPO / "jobs" / "evaluate.py"), str(runs["shuffled"] / "model"),
         "--baseline", str(runs["corpus"] / "model"), "--senteval-data", args.senteval_data,
         "--tasks", "sts", "--output", str(comparison_file)],
        check=True,
    )  # fmt: skip
    sts = json.loads(comparison_file.read_text())["comparison"]["sts"]
    result = {
        "sources_rows": [b - a for a, b in zip(starts, starts[1:])],
        "first_1000_rows_by_source": {n: first_rows_by_source(runs[n], starts) for n in ORDERS},
        "stsb_dev_best": {n: metrics[n]["stsb_dev_best"] for n in ORDERS},
        "sts": sts,  # per task: PairedDifference (baseline: corpus order, candidate: shuffled)
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"sources (rows): {result['sources_rows']}; first 1,000 trained rows by source: "
          f"{result['first_1000_rows_by_source']}")  # fmt: skip
    print(markdown_table(
        ["task", "corpus order", "shuffled order", "shuffled − corpus [95% CI]"],
        [[task, f"{e['baseline']:.2f}", f"{e['candidate']:.2f}",
          PairedDifference.from_dict(e).format()]
         for task, e in result["sts"].items()],
    ))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
