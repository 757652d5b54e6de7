"""InfoCSE at 10× the documents: the driver's peak memory stays flat.

    python -m bench.infocse_scale --json [--quick] [--workdir DIR]

An InfoCSE round's driver annotates the documents with a pool of Ray actors and writes the
positive pairs with Ray Data tasks; the round-to-round overlap is computed by Ray Data tasks
too. Nothing holds the documents or the pairs on the driver, so its peak memory should not grow
with the corpus. Measured here for N and 10·N generated documents (2,000 and 20,000; `--quick`
30 and 300, for the smoke test):

- documents: N JSONL rows ``{"id", "sentences"}``, each with a seeded random 5–30 sentences of
  6–20 words drawn from a few hundred English words (real tokens for the tokenizer); the first
  N documents of the 10·N corpus are the N corpus;
- model: a random-initialised BERT (hidden 32, 2 layers) with the packaged MiniLM tokenizer,
  so what is measured is the driver and the data path, not the model;
- each size in its own fresh process (a local Ray, 2 CPUs, 512 MiB object store), doing what
  a round's driver does: `read_documents`, `annotate_documents` of round 1 and again of round 2
  (same model, so the same pairs) into two directories, and `pair_overlap_on_cluster` of the
  two. That process reports:
  - driver_peak_rss_mib: its `getrusage(RUSAGE_SELF).ru_maxrss` (the driver alone: Ray's own
    processes and workers are not counted; this script, the parent it is spawned from, keeps
    itself small, as ru_maxrss also counts the parent's RSS at the fork);
  - driver_vmhwm_mib: /proc's VmHWM, this process image's own high-water mark (a check on the
    above);
  - pairs: the pairs one round wrote; seconds: wall time of both annotations and the overlap
    (Ray's start and the document read not included); overlap_jaccard: 1.0 (same model).

Prints a markdown table and the ratio; `--json` prints exactly one JSON line instead, shaped
{"documents": {"<N>": {"driver_peak_rss_mib", "driver_vmhwm_mib", "pairs", "seconds",
 "overlap_jaccard"}, "<10·N>": {...}}, "rss_ratio": peak at 10·N / peak at N}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distributed_emb.tables import markdown_table

FULL = (2_000, 20_000)
QUICK = (30, 300)
SEED = 0
OBJECT_STORE_BYTES = 512 * 2**20
# The environment a job runs in (runtime.ENVIRONMENT_DEFAULTS): offline, one tokenizer thread.
ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}

VOCABULARY = """
the a an and or but if then because while after before during between under over about
against among through across into onto from with without within near far early late new old
young small large long short high low great little good bad best worst first last next other
same different many few several every each some most more less all both either neither
city town village river mountain valley forest island coast harbour bridge road street railway
station airport school college university library museum hospital church market factory farm
garden park castle tower wall gate house home family child children mother father brother
sister friend teacher student doctor soldier farmer worker writer artist singer player leader
king queen president minister government council court law army navy police party election
vote war peace treaty border nation country state region province district capital century
year month week day night morning evening season summer winter spring autumn weather rain
snow wind storm sun moon star sky sea ocean lake water fire earth stone iron gold silver
wood paper glass bread milk meat fruit apple tree flower grass bird fish horse dog cat animal
music song film book story letter word language history science art theatre sport game team
match goal record history company business bank money price trade industry market office
building project plan system power energy machine engine car train ship plane computer phone
network television radio newspaper report study research theory method result question answer
problem reason idea example fact change growth increase decline success failure attack defence
victory loss journey travel visit meeting festival ceremony wedding birth death life health
disease medicine food dinner breakfast lunch kitchen table chair window door room floor roof
built opened closed founded created formed joined left arrived returned moved lived worked
played wrote published recorded released won lost beat defeated signed elected appointed
named called known described considered believed reported announced said told asked gave took
made found saw heard kept held brought bought sold paid carried followed led began ended
started finished grew fell rose became remained stayed served taught studied produced designed
painted sang walked ran travelled visited reached crossed covered replaced destroyed restored
quickly slowly finally recently often usually rarely later soon already still also only even
almost nearly together alone again once twice today tomorrow yesterday north south east west
central local national international public private royal military political economic social
cultural religious ancient modern famous popular important major minor main local rural urban
""".split()


# ---------------------------------------------------------------------------------------------
# Inputs (written by the parent, which stays small: see driver_peak_rss_mib in the docstring)
# ---------------------------------------------------------------------------------------------


def write_documents(path: Path, documents: int, seed: int = SEED) -> Path:
    """`documents` JSONL rows {"id", "sentences"}: 5–30 sentences of 6–20 words each, from one
    seeded generator (so a smaller corpus is the start of a larger one)."""
    rng = random.Random(seed)
    with open(path, "w") as handle:
        for index in range(documents):
            sentences = []
            for _ in range(rng.randint(5, 30)):
                words = rng.choices(VOCABULARY, k=rng.randint(6, 20))
                sentences.append(" ".join(words).capitalize() + ".")
            handle.write(json.dumps({"id": f"doc{index:07d}", "sentences": sentences}) + "\n")
    return path


def build_tiny_bert(directory: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> str:
    """A random-initialised BERT with MiniLM's tokenizer: real tokenisation, tiny compute (as
    tests/conftest.py builds it; run in a child process, see `_build_model`)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from distributed_emb.paths import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    torch.manual_seed(seed)
    BertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


# ---------------------------------------------------------------------------------------------
# One size's driver (a fresh process per size: ru_maxrss only ever grows)
# ---------------------------------------------------------------------------------------------


def drive(documents_path: str, model_dir: str, workdir: str) -> dict:
    """What an InfoCSE round's driver does, on a local Ray: read, annotate twice, overlap."""
    import resource

    import ray

    from distributed_emb.data.documents import DocumentsConfig, read_documents
    from distributed_emb.infocse.annotate import AnnotationConfig, annotate_documents
    from distributed_emb.infocse.pairs import pair_overlap_on_cluster
    from distributed_emb.train.worker import peak_rss_mb

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=OBJECT_STORE_BYTES,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        corpus = read_documents(DocumentsConfig(paths=[documents_path]), log=False)
        config = AnnotationConfig(
            pooler="mean", max_seq_length=32, concurrency=2, num_cpus_per_actor=0.5
        )
        rounds = [str(Path(workdir) / f"pairs_round{i}") for i in (1, 2)]
        started = time.perf_counter()
        results = [
            annotate_documents(corpus.dataset, model_dir, where, round_index=i, config=config)
            for i, where in enumerate(rounds, start=1)
        ]
        overlap = pair_overlap_on_cluster(*rounds)
        seconds = time.perf_counter() - started
    finally:
        ray.shutdown()
    if results[0].counts.pairs != results[1].counts.pairs:
        raise RuntimeError(f"same model, different pair counts: {[r.counts for r in results]}")
    return {
        "driver_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "driver_vmhwm_mib": round(peak_rss_mb(), 1),
        "annotated": [r.counts.documents for r in results],  # checked by the parent
        "pairs": results[0].counts.pairs,
        "seconds": round(seconds, 2),
        "overlap_jaccard": round(overlap.jaccard, 6),
    }


def _child(argv: list[str], what: str) -> str:
    """Run this script with `argv` in a fresh process; its last stdout line. Its stderr (Ray's
    and the package's logs) goes to ours."""
    command = [sys.executable, str(Path(__file__).resolve()), *argv]
    done = subprocess.run(
        command, stdout=subprocess.PIPE, text=True, env={**os.environ, **ENVIRONMENT}
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {done.stdout[-2000:]}")
    return lines[-1]


def measure(documents: int, documents_path: Path, model_dir: str, workdir: Path) -> dict:
    """One size's report, from its own driver process."""
    size_dir = workdir / f"run_{documents}"
    size_dir.mkdir()
    line = _child(
        ["--_drive", str(documents_path), "--_model", model_dir, "--_out", str(size_dir)],
        f"the driver for {documents:,} documents",
    )
    result = json.loads(line)
    annotated = result.pop("annotated")
    if annotated != [documents, documents]:
        raise RuntimeError(f"{documents:,} documents written, {annotated} annotated by the rounds")
    shutil.rmtree(size_dir, ignore_errors=True)  # the pairs: not needed after the counts
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--quick", action="store_true", help="30 and 300 documents (tests)")
    parser.add_argument("--workdir", default=None, help="default: a temporary directory")
    # The child processes' modes.
    parser.add_argument("--_drive", help=argparse.SUPPRESS)
    parser.add_argument("--_model", help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    parser.add_argument("--_build_model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args._build_model:
        with contextlib.redirect_stdout(sys.stderr):
            path = build_tiny_bert(Path(args._build_model))
        print(path)
        return 0
    if args._drive:
        with contextlib.redirect_stdout(sys.stderr):  # stdout: the JSON line alone
            result = drive(args._drive, args._model, args._out)
        print(json.dumps(result))
        return 0

    sizes = QUICK if args.quick else FULL
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="distributed_emb_infocse_scale_"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    try:
        # --json: stdout is the JSON line alone (anything else printed goes to stderr).
        with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
            model_dir = _child(["--_build_model", str(workdir / "tiny_bert")], "the tiny BERT")
            for documents in sizes:
                path = write_documents(workdir / f"documents_{documents}.jsonl", documents)
                results[str(documents)] = measure(documents, path, model_dir, workdir)
                print(f"{documents:,} documents: {json.dumps(results[str(documents)])}",
                      file=sys.stderr)  # fmt: skip
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    small, large = (results[str(n)] for n in sizes)
    ratio = round(large["driver_peak_rss_mib"] / small["driver_peak_rss_mib"], 3)

    if args.json:
        print(json.dumps({"documents": results, "rss_ratio": ratio}))
        return 0
    print(f"InfoCSE driver at {sizes[1] // sizes[0]}× the documents (2 annotation rounds and "
          f"their overlap; local Ray, 2 CPUs, tiny BERT)\n")  # fmt: skip
    rows = [
        [
            f"{int(n):,}",
            f"{r['pairs']:,}",
            f"{r['driver_peak_rss_mib']:.0f}",
            f"{r['driver_vmhwm_mib']:.0f}",
            f"{r['seconds']:.1f}",
            f"{r['overlap_jaccard']:.3f}",
        ]
        for n, r in results.items()
    ]
    columns = ["documents", "pairs (a round)", "driver peak RSS MiB (ru_maxrss)",
               "driver VmHWM MiB", "seconds", "overlap Jaccard"]  # fmt: skip
    print(markdown_table(columns, rows, right_aligned="rrrrrr"))
    print(f"\ndriver peak at {sizes[1]:,} / at {sizes[0]:,} documents: {ratio:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
