"""One MCR² compression run: embed once, train a head per output size, compare, export.

`run` reads top to bottom:

1. `read_inputs`: the training sentences (with cluster ids; the documents ``heldout.*`` holds
   out by the hash every method uses left out, and written as the run's document-level
   yardstick, ``documents_eval/``), the similar pairs and the dev sets that select (STS-B
   dev, and SICK-R dev where the SentEval data has it; or, with
   ``eval.select_by=retrieval:<split>``, that split of ``eval.retrieval_dir``; with
   ``documents:dev``, the yardstick's dev split).
2. `embed_inputs`: all of them through the frozen encoder in one Ray Data pass (cached on disk;
   a retrieval split that selects in a pass of its own, so its cache key is its own; the
   yardstick's passages at ``passage_length`` tokens, evaluation/yardsticks.py).
3. `train_heads`, `fit_methods`: for each output size an MCR² head (best epoch by
   ``eval.select_by``: the dev avg, or the retrieval or documents split's nDCG@10), and PCA
   and a random projection fitted on the same training vectors.
4. `evaluate_methods`: every method, and the uncompressed encoder, through the evaluation
   suite on the tasks present in the SentEval directory and on the splits of the BEIR
   directory ``eval.retrieval_dir`` (the shipped news set by default), and on the dev and
   test splits of the held-out documents' yardstick; each distinct sentence is embedded once
   for all methods.
5. `export_heads`, `write_outputs`: each head with its encoder as a SentenceTransformer
   directory under ``models/``; ``results.json``, ``results.md`` (the table, each row's
   difference from the uncompressed encoder and each head's from PCA at its size, with their
   paired 95% intervals) and
   ``heads_vs_baselines.png``. ``training_sentences.parquet`` (text, cluster_id) and the heads
   under ``models/`` are what jobs/finetune_mcr2.py fine-tunes end to end.

Metrics also go to the sinks of the ``logging`` section (distributed_emb.tracking), in
``output.dir``: ``train_log.jsonl`` and ``tensorboard/`` hold each head's epochs (kind
``head_<dim>``, step = epoch) and the comparison (kind = method, step = output size).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distributed_emb.atomic_files import write_text_atomic
from distributed_emb.evaluation import senteval_data as sd
from distributed_emb.evaluation.beir import (
    RetrievalSplit,
    list_splits,
    read_split,
    read_splits,
    score_splits,
)
from distributed_emb.evaluation.document_topics import write_held_out_yardstick
from distributed_emb.evaluation.results_tables import write_results
from distributed_emb.evaluation.suite import (
    GROUPS as TASK_GROUPS,
)
from distributed_emb.evaluation.suite import (
    TASK_SPECS,
    EvaluationConfig,
    RetrievalSettings,
    TaskSelection,
    evaluate,
    resolve_tasks,
)
from distributed_emb.evaluation.yardsticks import passage_length
from distributed_emb.mcr2.baselines import fit_baseline
from distributed_emb.mcr2.comparison_report import (
    DOCUMENTS,
    PLOT_FILE,
    comparison_panels,
    intervals_table,
    paired_intervals,
    results_table,
    summarise,
)
from distributed_emb.mcr2.compression_config import MCR2Config
from distributed_emb.mcr2.data import (
    SimilarPairs,
    TrainingSentences,
    idc_pairs,
    load_similar_pairs,
    load_training_sentences,
)
from distributed_emb.mcr2.embeddings import CachedEncoder
from distributed_emb.mcr2.export_with_head import export_compressed_model
from distributed_emb.mcr2.matryoshka import train_matryoshka, truncate
from distributed_emb.mcr2.train import (
    HeadTrainingData,
    RetrievalDevSet,
    TrainedHead,
    dev_scores,
    train_head,
)
from distributed_emb.paths import shipped_senteval_dir
from distributed_emb.plots import write_panels
from distributed_emb.selection import (
    SELECT_BY,
    STSB_DEV,
    describe,
    documents_split,
    retrieval_split,
    selected_metric,
)
from distributed_emb.tracking import MetricsSinks, outputs_on_storage

log = logging.getLogger(__name__)

# The heads' training sentences with their cluster ids: the corpus of jobs/finetune_mcr2.py.
TRAINING_SENTENCES_FILE = "training_sentences.parquet"
# The held-out documents' yardstick (BEIR layout) in output.dir, as InfoCSE's rounds name it.
DOCUMENTS_EVAL_DIR = "documents_eval"

Projection = Callable[[np.ndarray], np.ndarray]
# (output size, method) → projection of the frozen encoder's vectors, or a TextMethod
Methods = dict[tuple[int, str], "Projection | TextMethod"]


@dataclass
class RunInputs:
    sentences: TrainingSentences
    pairs: SimilarPairs | None
    senteval_dir: str  # the dev sets (selection) come from here
    dev: dict[str, sd.StsData]  # "stsb_dev", and "sickr_dev" where senteval_dir has SICK
    # Every evaluation directory: senteval_dir, then eval.extra_senteval_dirs.
    eval_dirs: list[str] = dataclasses.field(default_factory=list)
    # The split that chooses the epochs: eval.select_by=retrieval:<split>, that split of
    # eval.retrieval_dir; documents:dev, the dev split of documents_dir.
    retrieval_dev: RetrievalSplit | None = None
    # The held-out documents' yardstick (BEIR layout) the run wrote; None: none held out, or
    # none with 2 passages.
    documents_dir: str | None = None


@dataclass
class Evaluation:
    rows: list[dict]  # {"dim", "method", **summary}: the table
    suite_outputs: dict[str, dict]  # "<method>-<dim>" → the evaluation suite's output
    tasks: list[str]
    absent: list[str]


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


def tasks_by_dir(
    senteval_dirs: list[str], groups: list[str]
) -> tuple[dict[str, list[str]], list[str]]:
    """{directory: tasks read from it} (each task from the first directory holding it), and
    the tasks no directory holds."""
    placed: dict[str, list[str]] = {}
    found: set[str] = set()
    for directory in senteval_dirs:
        present, _ = present_tasks(directory, groups)
        new = [task for task in present if task not in found]
        if new:
            placed[directory] = new
            found.update(new)
    _, absent = present_tasks(senteval_dirs[0], groups)
    return placed, [task for task in absent if task not in found]


def selected_on(select_by: str, dev_names: list[str]) -> str:
    """What chose the heads' epochs, in words: describe(select_by), or for stsb_dev with
    SICK-R dev beside STS-B dev, their mean."""
    if select_by == STSB_DEV and len(dev_names) > 1:
        named = {"stsb_dev": "STS-B dev", "sickr_dev": "SICK-R dev"}
        return f"the mean Spearman of {' and '.join(named.get(n, n) for n in dev_names)}"
    return describe(select_by)


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        return None


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Torch's intra-op threads set to `count` inside the block, restored after. Only the
    heads' small matmuls run on `train.torch_threads`; encoding in this process and the
    Matryoshka fine-tuning keep every core (with 1 thread they ran at half speed on 2 cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def _timed(timings: dict[str, float], key: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timings[key] = time.perf_counter() - start


def run(config: MCR2Config) -> dict:
    """Train, compare and export; returns the results written to ``results.json``. With
    ``output.storage_path``, everything in ``output.dir`` also lives on storage
    (tracking.outputs_on_storage): the logs and curves while the run goes, the rest at its end."""
    output_dir = Path(config.output.dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    output = config.output
    with outputs_on_storage(
        output.storage_path, output.run_name or output_dir.resolve().name, output_dir
    ) as stored:
        results, heads = _run(config, output_dir)
        results["storage_uri"] = stored
        write_outputs(results, heads, output_dir)
    return results


def _run(config: MCR2Config, output_dir: Path) -> tuple[dict, dict[int, TrainedHead]]:
    started = time.perf_counter()
    load_at_start = _load_average()
    timings: dict[str, float] = {}
    sinks = MetricsSinks.start(
        config.logging, output_dir, dataclasses.asdict(config), run_name=output_dir.name
    )
    try:
        inputs = read_inputs(config)
        inputs.sentences.write_parquet(output_dir / TRAINING_SENTENCES_FILE)
        encoder = CachedEncoder(config.model)
        passages = passage_encoder(config, encoder.model_path)
        with _timed(timings, "encode_training_s"):
            data, pairs_summary = embed_inputs(config, inputs, encoder, passages)
        log.info(
            "embedded training data in %.1f s (%s)", timings["encode_training_s"], encoder.stats
        )
        with _timed(timings, "train_heads_s"), torch_threads(config.train.torch_threads):
            heads = train_heads(config, data, sinks)
            methods = fit_methods(config, heads, data.sentences)
        matryoshka = None
        if "matryoshka" in config.baselines:
            with _timed(timings, "train_matryoshka_s"):
                matryoshka = train_matryoshka_baseline(config, inputs, output_dir)
                methods.update(matryoshka_methods(config, matryoshka, encoder))
        with _timed(timings, "evaluate_s"):
            evaluation = evaluate_methods(config, methods, encoder, inputs, sinks, passages)
        exported = {}
        if config.export:
            with _timed(timings, "export_s"):
                exported = export_heads(config, heads, encoder.model_path, output_dir)
    finally:
        sinks.close()
    timings["total_s"] = time.perf_counter() - started
    results = {
        "table": evaluation.rows,
        # Each row minus the uncompressed encoder, and each head minus PCA at its size, on
        # each test set and retrieval split, with their 95% intervals.
        "intervals": paired_intervals(evaluation.rows, evaluation.suite_outputs),
        "training": {
            # What chose each head's epoch: eval.select_by, and in words.
            SELECT_BY: config.eval.select_by,
            "selected_on": selected_on(config.eval.select_by, list(inputs.dev)),
            "sentences": inputs.sentences.summary,
            "pairs": pairs_summary,
            # Held out of the sentences, the clusters and the pairs (heldout.*): the run's
            # document-level yardstick, scored for every method on its dev and test splits.
            "documents_dir": inputs.documents_dir,
            "held_out_documents": len(inputs.sentences.held_out),
            "heads": {
                dim: {
                    "best_epoch": h.best_epoch,
                    "best_select_score": h.best_score,
                    "best_stsb_dev": h.best_dev["stsb_dev"],
                    "best_dev": h.best_dev,
                    "seconds": h.seconds,
                    "history": h.history,
                }
                for dim, h in heads.items()
            },
        },
        "exported_models": exported,
        "matryoshka": None
        if matryoshka is None
        else {"path": matryoshka.path, "seconds": matryoshka.seconds, "losses": matryoshka.losses},
        "evaluation": evaluation.suite_outputs,
        "tasks_evaluated": evaluation.tasks,
        "tasks_absent": evaluation.absent,
        "senteval_dir": inputs.senteval_dir,
        "senteval_dirs": inputs.eval_dirs,
        "encoder": {"model_path": encoder.model_path, **encoder.stats},
        "wall_time_s": timings,
        "load_average": {"start": load_at_start, "end": _load_average()},
        "config": dataclasses.asdict(config),
    }
    return results, heads


def read_inputs(config: MCR2Config) -> RunInputs:
    """The training sentences (the held-out documents left out, their yardstick written to
    output.dir/documents_eval), the pairs, the dev sets and the split that chooses."""
    sentences = load_training_sentences(config.sentences, config.heldout)
    log.info("training sentences: %s", sentences.summary)
    documents_dir = write_documents_yardstick(config, sentences.held_out)
    pairs = load_similar_pairs(config.pairs)
    if pairs is not None:
        log.info("similar pairs: %s", pairs.summary)
    senteval_dir = config.eval.senteval_dir or shipped_senteval_dir()
    return RunInputs(
        sentences,
        pairs,
        senteval_dir,
        read_dev_sets(senteval_dir),
        [senteval_dir, *config.eval.extra_senteval_dirs],
        read_selection_split(config, documents_dir),
        documents_dir,
    )


def write_documents_yardstick(config: MCR2Config, held_rows: list[dict]) -> str | None:
    """The held-out documents' yardstick (evaluation/document_topics.py) in
    output.dir/documents_eval, replacing a previous run's; None when no document is held out
    or none has 2 passages."""
    target = Path(config.output.dir) / DOCUMENTS_EVAL_DIR
    if target.exists():
        shutil.rmtree(target)  # a previous run's splits must not outlive it
    if not held_rows:
        return None
    return write_held_out_yardstick(
        held_rows, config.heldout, config.sentences.documents().paths, target
    )


def read_selection_split(config: MCR2Config, documents_dir: str | None) -> RetrievalSplit | None:
    """The split eval.select_by chooses the heads' epochs on: retrieval:<split> of
    eval.retrieval_dir, documents:dev of the run's yardstick; None for stsb_dev."""
    select_by = config.eval.select_by
    split = retrieval_split(select_by)
    if split is not None:
        return read_split(config.eval.retrieval_dir, split)
    split = documents_split(select_by)
    if split is None:
        return None
    if documents_dir is None or split not in list_splits(documents_dir):
        raise ValueError(
            f"eval.select_by={select_by}: no held-out {split} document has 2 passages "
            f"(heldout.fraction={config.heldout.fraction}, heldout.seed={config.heldout.seed} "
            f"of {config.sentences.documents().paths}); raise heldout.fraction or choose by "
            f"{STSB_DEV}"
        )
    return read_split(documents_dir, split)


def passage_encoder(config: MCR2Config, model_path: str) -> CachedEncoder:
    """The frozen encoder at the yardstick's passage length (yardsticks.passage_length:
    eval.documents_max_seq_length, at most the model's position limit); cached apart from the
    sentences' vectors (the length is in the cache key)."""
    length = passage_length(config.eval, model_path)
    return CachedEncoder(dataclasses.replace(config.model, max_seq_length=length))


def read_dev_sets(senteval_dir: str) -> dict[str, sd.StsData]:
    """The selection sets: STS-B dev, and SICK-R dev (SICK_trial) when the directory has SICK.
    Two domains, so an epoch is not picked for STS-B's news/captions/forums alone."""
    dev = {"stsb_dev": sd.read_sts_benchmark(senteval_dir, "dev")}
    if sd.task_present(senteval_dir, "SICKRelatedness", TASK_SPECS["SICKRelatedness"].needed):
        dev["sickr_dev"] = sd.read_sick_relatedness(senteval_dir, "dev")
    return dev


def embed_inputs(
    config: MCR2Config,
    inputs: RunInputs,
    encoder: CachedEncoder,
    passages: CachedEncoder | None = None,
) -> tuple[HeadTrainingData, str]:
    """The frozen encoder's vectors of everything the heads train and select on, embedded in
    one pass; and a one-line description of the pair term's data. `passages`: the encoder of
    the held-out documents' passages (passage_encoder), needed with documents:dev."""
    sentences, pairs = inputs.sentences, inputs.pairs
    train_texts = sentences.texts + (pairs.anchors + pairs.positives if pairs else [])
    dev_texts = [s for dev in inputs.dev.values() for s in dev.sentences1 + dev.sentences2]
    encoder(train_texts + dev_texts)  # one pass; the calls below hit it
    x = encoder(sentences.texts)  # (n, D)
    if pairs is None and config.pairs.source == "idc":
        pairs = inputs.pairs = idc_pairs(sentences.texts, x, sentences.cluster_ids, config.pairs)
        log.info("similar pairs: %s", pairs.summary)
    if pairs is not None:
        pair_vectors = (encoder(pairs.anchors), encoder(pairs.positives))  # 2 × (m, D)
        pairs_summary = pairs.summary
    elif config.pairs.source == "dropout":
        limit = config.pairs.max_pairs or len(sentences.texts)
        pair_vectors = encoder.dropout_views(sentences.texts[:limit], seed=config.pairs.seed)
        pairs_summary = f"{limit} dropout-view pairs of training sentences"
    else:
        pair_vectors, pairs_summary = None, "no pair term"
    retrieval = selection_set(config, inputs, encoder, passages)
    data = HeadTrainingData(
        x,
        sentences.cluster_ids if config.assignments.source == "column" else None,
        pair_vectors,
        {
            name: (encoder(dev.sentences1), encoder(dev.sentences2), dev.scores)
            for name, dev in inputs.dev.items()
        },
        retrieval,
    )
    return data, pairs_summary


def selection_set(
    config: MCR2Config,
    inputs: RunInputs,
    encoder: CachedEncoder,
    passages: CachedEncoder | None,
) -> RetrievalDevSet | None:
    """The split that chooses each head's epoch with its frozen-encoder vectors, embedded once
    for every head and epoch (the evaluation's search of it then hits memory): a retrieval
    split by `encoder`, the documents' dev split by `passages`; None for stsb_dev."""
    split = inputs.retrieval_dev
    if split is None:
        return None
    documents = documents_split(config.eval.select_by) is not None
    if documents and passages is None:
        raise ValueError(f"eval.select_by={config.eval.select_by} needs the passage encoder")
    embed = passages if documents else encoder
    vectors = embed([*split.query_texts, *split.corpus_texts])  # (q + c, D)
    return RetrievalDevSet(split, vectors, selected_metric(config.eval.select_by))


def train_heads(
    config: MCR2Config, data: HeadTrainingData, sinks: MetricsSinks
) -> dict[int, TrainedHead]:
    """One MCR² head per output size, each at its best epoch by eval.select_by; every epoch's
    metrics go to the sinks (kind ``head_<dim>``)."""
    heads: dict[int, TrainedHead] = {}
    for dim in config.output_dims:
        trained = train_head(
            dim, data, config.head, config.loss, config.assignments, config.train,
            log_every=config.logging.logging_steps,
        )  # fmt: skip
        for row in trained.history:
            sinks.log(row["epoch"], {k: v for k, v in row.items() if k != "epoch"}, f"head_{dim}")
        log.info(
            "MCR² head %d: best %.2f on %s (%s) at epoch %d (%.1f s)",
            dim,
            trained.best_score,
            selected_on(config.eval.select_by, list(data.dev)),
            ", ".join(f"{k} {v:.2f}" for k, v in trained.best_dev.items()),
            trained.best_epoch,
            trained.seconds,
        )
        heads[dim] = trained
    return heads


@dataclass
class TextMethod:
    """A method that embeds text itself (a fine-tuned encoder), not a projection of the
    frozen encoder's vectors."""

    encode: Callable[[list[str]], np.ndarray]
    # The held-out documents' passages (at the passage length); None: `encode`.
    encode_passages: Callable[[list[str]], np.ndarray] | None = None


def train_matryoshka_baseline(config: MCR2Config, inputs: RunInputs, output_dir: Path):
    """The encoder fine-tuned with MatryoshkaLoss on the run's pairs (or dropout views of
    its sentences), saved under ``models/matryoshka``."""
    m = config.matryoshka
    if m.positives == "pairs":
        if inputs.pairs is None:
            raise ValueError("matryoshka.positives=pairs, but the run has no text pairs")
        anchors, positives = inputs.pairs.anchors, inputs.pairs.positives
    else:
        anchors = positives = inputs.sentences.texts
    trained = train_matryoshka(
        config.model.model_path(),
        config.model.pooler,
        config.model.max_seq_length,
        anchors,
        positives,
        list(config.output_dims),
        m,
        output_dir / "models" / "matryoshka",
    )
    log.info("Matryoshka baseline: %d steps in %.1f s", m.steps, trained.seconds)
    return trained


def matryoshka_methods(config: MCR2Config, trained, encoder: CachedEncoder) -> Methods:
    """The fine-tuned encoder truncated to each output size; its vectors are cached like the
    frozen encoder's (its own directory, so its own cache keys)."""
    tuned_config = dataclasses.replace(config.model, path=trained.path, pooler=None)
    tuned = CachedEncoder(tuned_config)
    tuned_passages = CachedEncoder(
        dataclasses.replace(tuned_config, max_seq_length=passage_length(config.eval, trained.path))
    )
    return {
        (dim, "matryoshka"): TextMethod(
            lambda texts, dim=dim: truncate(tuned(texts), dim),
            lambda texts, dim=dim: truncate(tuned_passages(texts), dim),
        )
        for dim in config.output_dims
    }


def fit_methods(config: MCR2Config, heads: dict[int, TrainedHead], x: np.ndarray) -> Methods:
    """Each head and each baseline of `config.baselines` at each size, as projections of
    the encoder's vectors; ``full`` once, at the encoder's own size."""
    methods: Methods = {}
    for dim, trained in heads.items():
        methods[(dim, "mcr2")] = head_projection(trained)
        for name in config.baselines:
            if name not in ("full", "matryoshka"):
                methods[(dim, name)] = fit_baseline(name, x, dim, config.train.seed)
    if "full" in config.baselines:
        methods[(x.shape[1], "full")] = fit_baseline("full", x, x.shape[1])
    return methods


def evaluate_methods(
    config: MCR2Config,
    methods: Methods,
    encoder: CachedEncoder,
    inputs: RunInputs,
    sinks: MetricsSinks,
    passages: CachedEncoder | None = None,
) -> Evaluation:
    """Every method through the suite, on the tasks present, and on the held-out documents'
    splits (their passages through `passages`, the frozen encoder at the passage length);
    each table row also goes to the sinks (kind = method, step = output size)."""
    placed, absent = tasks_by_dir(inputs.eval_dirs or [inputs.senteval_dir], config.eval.tasks)
    tasks = [task for dir_tasks in placed.values() for task in dir_tasks]
    if absent:
        log.info(
            "tasks without data in %s (not evaluated): %s",
            ", ".join(inputs.eval_dirs or [inputs.senteval_dir]),
            ", ".join(absent),
        )
    eval_configs = [
        EvaluationConfig(
            eval=TaskSelection(senteval_dir=directory, tasks=dir_tasks),
            transfer=config.eval.transfer,
            retrieval=RetrievalSettings(threshold=config.eval.retrieval_min_score),
        )
        for directory, dir_tasks in placed.items()
    ]
    if config.eval.retrieval_dir is not None:  # a BEIR-only pass (tasks=None): once, not per dir
        eval_configs.append(
            EvaluationConfig(
                eval=TaskSelection(
                    senteval_dir=inputs.senteval_dir,
                    retrieval_dir=config.eval.retrieval_dir,
                    retrieval_splits=config.eval.retrieval_splits,
                )
            )
        )
    documents = []  # the yardstick's splits, read once, its corpus shared
    if inputs.documents_dir is not None and passages is not None:
        documents = read_splits(inputs.documents_dir, list_splits(inputs.documents_dir))
    evaluation = Evaluation([], {}, tasks, absent)
    for (dim, method), project in methods.items():
        if isinstance(project, TextMethod):
            encode = project.encode
            encode_passages = project.encode_passages or encode
        else:

            def encode(texts: list[str], project=project) -> np.ndarray:
                return project(encoder(texts))  # the frozen encoder's vectors are cached

            def encode_passages(texts: list[str], project=project) -> np.ndarray:
                return project(passages(texts))

        def embed_dev(name: str, side: int, encode=encode) -> np.ndarray:
            dev = inputs.dev[name]
            return encode(dev.sentences2 if side else dev.sentences1)

        selection = dev_scores(embed_dev, {name: dev.scores for name, dev in inputs.dev.items()})
        output = merge_outputs([evaluate(c, encode=encode) for c in eval_configs])
        if documents:
            # The same search and scorer as the suite's BEIR splits (and the selection's).
            output[DOCUMENTS] = score_splits(encode_passages, documents)
            output["documents_dir"] = inputs.documents_dir
        evaluation.suite_outputs[f"{method}-{dim}"] = output
        summary = summarise(output, selection)
        evaluation.rows.append({"dim": dim, "method": method, **summary})
        sinks.log(dim, summary, method)
        log.info("evaluated %s-%d: %s", method, dim, evaluation.rows[-1])
    return evaluation


def merge_outputs(outputs: list[dict]) -> dict:
    """The suite's outputs for several directories as one: the group dicts (``sts``,
    ``transfer``, ``retrieval``, ..., and the BEIR splits, ``beir``) merged, the directories
    listed."""
    if not outputs:
        return {}
    merged: dict = {"senteval_dirs": [o.get("senteval_dir") for o in outputs], "skipped": []}
    for output in outputs:
        for key, value in output.items():
            if key == "skipped":
                merged["skipped"].extend(value)
            elif key in (*TASK_GROUPS, "beir") and isinstance(value, dict):
                merged.setdefault(key, {}).update(value)
            else:
                merged.setdefault(key, value)
    return merged


def export_heads(
    config: MCR2Config, heads: dict[int, TrainedHead], model_path: str, output_dir: Path
) -> dict[int, str]:
    """Each head with its encoder as ``models/mcr2-<dim>``; the paths by size."""
    exported = {}
    for dim, trained in heads.items():
        path = export_compressed_model(
            output_dir / "models" / f"mcr2-{dim}",
            model_path,
            trained.head,
            pooler=config.model.pooler,
            max_seq_length=config.model.max_seq_length,
            metadata={
                "stsb_dev": trained.best_dev["stsb_dev"],
                "dev": trained.best_dev,
                "best_epoch": trained.best_epoch,
                SELECT_BY: config.eval.select_by,  # what chose best_epoch
                "loss": dataclasses.asdict(config.loss),
            },
        )
        exported[dim] = str(path)
    return exported


def write_outputs(results: dict, heads: dict[int, TrainedHead], output_dir: Path) -> None:
    """``results.json``, ``results.md`` and the comparison plot; ``results["table_markdown"]``
    for the job's console."""
    table = results_table(results["table"])
    write_results(results, output_dir / "results.json")
    write_text_atomic(output_dir / "results.md", _markdown_report(results, table))
    write_panels(
        comparison_panels(results["table"], {dim: h.history for dim, h in heads.items()}),
        output_dir / PLOT_FILE,
        title="MCR² heads against PCA and a random projection",
    )
    results["table_markdown"] = table


def _markdown_report(results: dict, table: str) -> str:
    training = results["training"]
    timings = ", ".join(f"{k} {v:.1f}" for k, v in results["wall_time_s"].items())
    lines = [
        "# MCR² compression run",
        "",
        table,
        "",
        f"Difference from {results['intervals']['reference']} on each evaluation set, "
        "paired-bootstrap 95% interval (pairs and queries resampled; * excludes 0):",
        "",
        intervals_table(results["intervals"]),
        "",
        "Each head minus PCA at the same size, paired-bootstrap 95% interval (* excludes 0):",
        "",
        intervals_table(results["intervals"], "versus_pca")
        if results["intervals"]["versus_pca"]
        else "(no head with a PCA row at its size)",
        "",
        f"- training sentences: {results['training']['sentences'].splitlines()[0]}",
        f"- pairs: {results['training']['pairs']}",
        f"- tasks evaluated: {', '.join(results['tasks_evaluated']) or 'none'}",
        f"- each head's epoch chosen by {training['selected_on']} "
        f"(`eval.select_by={training[SELECT_BY]}`): "
        + ", ".join(
            f"{dim} dims epoch {head['best_epoch']} ({head['best_select_score']:.2f})"
            for dim, head in training["heads"].items()
        ),
        f"- retrieval (BEIR layout, nDCG@10 × 100): "
        f"{results['config']['eval']['retrieval_dir'] or 'none'}",
        f"- held-out documents (topic retrieval among their passages, nDCG@10 × 100; "
        f"{training['held_out_documents']} documents never trained on): "
        f"{training['documents_dir'] or 'none'}",
        f"- SentEval dirs: {', '.join(results['senteval_dirs'])} (STS-B dev from "
        f"{results['senteval_dir']})",
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
