"""One MCR² compression run: embed once, train a head per output size, compare, export.

1. Read the training sentences (with cluster ids), the similar pairs and STS-B dev.
2. Embed all of them with the frozen encoder in one Ray Data pass (cached on disk).
3. For each output size: train an MCR² head (best epoch by STS-B dev), fit PCA and a random
   projection on the same training vectors.
4. Evaluate every method, and the uncompressed encoder, with the evaluation suite on the tasks
   present in the SentEval directory; each distinct sentence is embedded once for all methods.
5. Write ``results.json`` and ``results.md`` (the table), and export each head with its
   encoder as a SentenceTransformer directory under ``models/``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from distributed_emb.atomic_files import write_text_atomic
from distributed_emb.evaluation import senteval_data as sd
from distributed_emb.evaluation.report import write_results
from distributed_emb.evaluation.sts import spearman_of_embeddings
from distributed_emb.evaluation.suite import (
    TASK_SPECS,
    EvaluationConfig,
    RetrievalSettings,
    evaluate,
    resolve_tasks,
)
from distributed_emb.mcr2.baselines import fit_baseline
from distributed_emb.mcr2.config import MCR2Config
from distributed_emb.mcr2.data import load_similar_pairs, load_training_sentences
from distributed_emb.mcr2.embeddings import CachedEncoder
from distributed_emb.mcr2.export import export_compressed_model
from distributed_emb.mcr2.report import markdown_table, summarise
from distributed_emb.mcr2.train import HeadTrainingData, TrainedHead, train_head
from distributed_emb.paths import shipped_senteval_dir

log = logging.getLogger(__name__)

Projection = Callable[[np.ndarray], np.ndarray]


def head_projection(trained: TrainedHead) -> Projection:
    def project(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return trained.head(torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()

    return project


def present_tasks(senteval_dir: str, groups: list[str]) -> tuple[list[str], list[str]]:
    """Tasks of `groups` whose data is in `senteval_dir`, and the absent ones (checked once,
    so the suite does not warn about each absent task for every method)."""
    present, absent = [], []
    for tasks in resolve_tasks(groups).values():
        for task in tasks:
            (
                present if sd.task_present(senteval_dir, task, TASK_SPECS[task].needed) else absent
            ).append(task)
    return present, absent


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        return None


def run(config: MCR2Config) -> dict:
    """Train, compare and export; returns the results written to ``results.json``."""
    started = time.perf_counter()
    load_at_start = _load_average()
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(config.optim.torch_threads)
    timings: dict[str, float] = {}

    # 1. Data.
    sentences = load_training_sentences(config.sentences)
    log.info("training sentences: %s", sentences.summary)
    pairs = load_similar_pairs(config.pairs)
    if pairs is not None:
        log.info("similar pairs: %s", pairs.summary)
    senteval_dir = config.eval.senteval_dir or shipped_senteval_dir()
    dev = sd.read_sts_benchmark(senteval_dir, "dev")

    # 2. Frozen-encoder vectors, one pass for everything the heads train and select on.
    encoder = CachedEncoder(config.encoder)
    t = time.perf_counter()
    train_texts = sentences.texts + (pairs.anchors + pairs.positives if pairs else [])
    encoder(train_texts + dev.sentences1 + dev.sentences2)
    x = encoder(sentences.texts)  # (n, D)
    if pairs is not None:
        pair_vectors = (encoder(pairs.anchors), encoder(pairs.positives))  # 2 × (m, D)
        pairs_summary = pairs.summary
    elif config.pairs.source == "dropout":
        limit = config.pairs.max_pairs or len(sentences.texts)
        pair_vectors = encoder.dropout_views(sentences.texts[:limit], seed=config.pairs.seed)
        pairs_summary = f"{limit} dropout-view pairs of training sentences"
    else:
        pair_vectors, pairs_summary = None, "no pair term"
    dev_vectors = (encoder(dev.sentences1), encoder(dev.sentences2), dev.scores)
    timings["encode_training_s"] = time.perf_counter() - t
    log.info("embedded training data in %.1f s (%s)", timings["encode_training_s"], encoder.stats)
    data = HeadTrainingData(
        x,
        sentences.cluster_ids if config.assignments.source == "column" else None,
        pair_vectors,
        dev_vectors,
    )

    # 3. Heads and baselines per output size.
    methods: dict[tuple[int, str], Projection] = {}
    heads: dict[int, TrainedHead] = {}
    t = time.perf_counter()
    for dim in config.output_dims:
        trained = train_head(dim, data, config.head, config.loss, config.assignments, config.optim)
        heads[dim] = trained
        log.info(
            "MCR² head %d: best STS-B dev %.2f at epoch %d (%.1f s)",
            dim,
            trained.best_dev_spearman,
            trained.best_epoch,
            trained.seconds,
        )
        methods[(dim, "mcr2")] = head_projection(trained)
        for name in config.baselines:
            if name != "full":
                methods[(dim, name)] = fit_baseline(name, x, dim, config.optim.seed)
    if "full" in config.baselines:
        methods[(x.shape[1], "full")] = fit_baseline("full", x, x.shape[1])
    timings["train_heads_s"] = time.perf_counter() - t

    # 4. Evaluation: every method through the suite, on the tasks present.
    tasks, absent = present_tasks(senteval_dir, list(config.eval.tasks))
    if absent:
        log.info("tasks without data in %s (not evaluated): %s", senteval_dir, ", ".join(absent))
    eval_config = EvaluationConfig(
        senteval_dir=senteval_dir,
        tasks=tasks,
        transfer=config.eval.transfer,
        retrieval=RetrievalSettings(threshold=config.eval.retrieval_min_score),
    )
    rows, suite_outputs = [], {}
    t = time.perf_counter()
    for (dim, method), project in methods.items():

        def encode(texts: list[str], project=project) -> np.ndarray:
            return project(encoder(texts))

        stsb_dev = spearman_of_embeddings(
            project(dev_vectors[0]), project(dev_vectors[1]), dev.scores
        )
        output = evaluate(eval_config, encode=encode) if tasks else {}
        suite_outputs[f"{method}-{dim}"] = output
        rows.append({"dim": dim, "method": method, **summarise(output, stsb_dev)})
        log.info("evaluated %s-%d: %s", method, dim, rows[-1])
    timings["evaluate_s"] = time.perf_counter() - t

    # 5. Export and write.
    exported = {}
    if config.export:
        t = time.perf_counter()
        for dim, trained in heads.items():
            path = export_compressed_model(
                output_dir / "models" / f"mcr2-{dim}",
                encoder.model_path,
                trained.head,
                pooler=config.encoder.pooler,
                max_seq_length=config.encoder.max_seq_length,
                metadata={
                    "stsb_dev": trained.best_dev_spearman,
                    "best_epoch": trained.best_epoch,
                    "loss": dataclasses.asdict(config.loss),
                },
            )
            exported[dim] = str(path)
        timings["export_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - started

    table = markdown_table(rows)
    results = {
        "table": rows,
        "training": {
            "sentences": sentences.summary,
            "pairs": pairs_summary,
            "heads": {
                dim: {
                    "best_epoch": h.best_epoch,
                    "best_stsb_dev": h.best_dev_spearman,
                    "seconds": h.seconds,
                    "history": h.history,
                }
                for dim, h in heads.items()
            },
        },
        "exported_models": exported,
        "evaluation": suite_outputs,
        "tasks_evaluated": tasks,
        "tasks_absent": absent,
        "senteval_dir": senteval_dir,
        "encoder": {"model_path": encoder.model_path, **encoder.stats},
        "wall_time_s": timings,
        "load_average": {"start": load_at_start, "end": _load_average()},
        "config": dataclasses.asdict(config),
    }
    write_results(results, output_dir / "results.json")
    write_text_atomic(output_dir / "results.md", _markdown_report(results, table))
    results["table_markdown"] = table
    return results


def _markdown_report(results: dict, table: str) -> str:
    timings = ", ".join(f"{k} {v:.1f}" for k, v in results["wall_time_s"].items())
    lines = [
        "# MCR² compression run",
        "",
        table,
        "",
        f"- training sentences: {results['training']['sentences'].splitlines()[0]}",
        f"- pairs: {results['training']['pairs']}",
        f"- tasks evaluated: {', '.join(results['tasks_evaluated']) or 'none'}",
        f"- SentEval dir: {results['senteval_dir']}",
        f"- wall time (s): {timings}",
        f"- load average (1/5/15 min) at start {results['load_average']['start']}, "
        f"end {results['load_average']['end']}",
        "",
        "Config:",
        "",
        "```json",
        json.dumps(results["config"], indent=1),
        "```",
        "",
    ]
    return "\n".join(lines)
