"""The evaluation suite: which tasks exist, where their data is, and running them.

Tasks come in groups (``sts``, ``transfer``, ``retrieval``, ``geometry``). For each group the
suite reads every present task, embeds the group's distinct sentences in one pass (a Ray Data
actor pool by default), then scores each task from those embeddings. A task whose files are
all absent from the SentEval directory is skipped and listed; a task that is present but
malformed raises, naming the file and line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from distributed_emb.checks import ConfigError
from distributed_emb.evaluation import beir
from distributed_emb.evaluation import senteval_data as sd
from distributed_emb.evaluation.geometry import sts_geometry
from distributed_emb.evaluation.retrieval import evaluate_retrieval, sts_retrieval_task
from distributed_emb.evaluation.sts import (
    per_pair,
    spearman_x100,
    sts_cosines,
    sts_subsets_spearman,
)
from distributed_emb.evaluation.transfer import (
    TransferConfig,
    evaluate_binary,
    evaluate_mrpc,
    evaluate_sst2,
    evaluate_trec,
)
from distributed_emb.model.embedder import (
    EmbeddingLookup,
    make_encoders,
    use_encoding_pool,
)
from distributed_emb.model.model_config import PromptSettings, applied_prompts
from distributed_emb.paths import default_model_path, shipped_senteval_dir
from distributed_emb.ray_config import RayConfig, validate_ray_config
from distributed_emb.settings import section

log = logging.getLogger(__name__)

Encoder = Callable[[list[str]], np.ndarray]

STS_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")
TRANSFER_TASKS = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
RETRIEVAL_TASKS = ("STSBenchmark-retrieval",)
GEOMETRY_TASKS = ("STSBenchmark-geometry",)
GROUPS: dict[str, tuple[str, ...]] = {
    "sts": STS_TASKS,
    "transfer": TRANSFER_TASKS,
    "retrieval": RETRIEVAL_TASKS,
    "geometry": GEOMETRY_TASKS,
}


@section
class EncodeSettings:
    pooler: Annotated[
        Literal["cls", "cls_before_pooler", "mean"] | None,
        Field(
            description="the sentence vector of a plain Hugging Face encoder: mean of tokens, "
            "[CLS] through the pooler, or raw [CLS]; null: a SentenceTransformer directory as "
            "saved, else cls_before_pooler"
        ),
    ] = None
    batch_size: Annotated[int, Field(ge=1, description="sentences per encoding batch")] = 128
    max_seq_length: Annotated[
        int | None,
        Field(
            ge=4,
            description="tokens per sentence (longer ones are cut); null: the model's own",
        ),
    ] = None
    # model/embedder.py use_encoding_pool.
    use_ray: Annotated[
        bool | Literal["auto"],
        Field(
            description="encode in a Ray Data actor pool (true) or in this process (false); "
            "auto: the pool when joining a cluster or with concurrency above 1"
        ),
    ] = "auto"
    concurrency: Annotated[int, Field(ge=1, description="encoding actors of the pool")] = 1
    num_cpus_per_actor: Annotated[
        float | None,
        Field(
            ge=0,
            description="CPUs each encoding actor reserves; null: a share that leaves one CPU "
            "for Ray Data's tasks",
        ),
    ] = None
    num_gpus_per_actor: Annotated[
        float | None,
        Field(
            ge=0,
            description="GPUs each encoding actor reserves; null: 1 if the cluster has a GPU "
            "per actor, else 0",
        ),
    ] = None
    torch_threads: Annotated[
        int | None,
        Field(ge=1, description="torch threads per encoding actor; null: Ray's per-actor default"),
    ] = None


@section
class RetrievalSettings:
    # STS-B gold scores run from 0 to 5: a bound outside selects nothing or everything.
    threshold: Annotated[
        float,
        Field(
            ge=0,
            le=5,
            description="STS-B test pairs with a gold score at least this are the retrieval "
            "task's (query, positive) pairs; the others' second sentences are distractors",
        ),
    ] = 4.0
    # At least one k: validate().
    ks: Annotated[
        list[Annotated[int, Field(ge=1)]],
        Field(description="the k of each Recall@k reported"),
    ] = field(default_factory=lambda: [1, 5, 10])


@section
class EvaluatedModelConfig:
    path: Annotated[
        str | None,
        Field(
            description="the encoder: a SentenceTransformer or plain Hugging Face model "
            "directory; null: the packaged all-MiniLM-L6-v2"
        ),
    ] = None


@section
class TaskSelection:
    senteval_dir: Annotated[
        str | None,
        Field(
            description="SentEval's data/downstream directory (or its parent data/); null: the "
            "shipped STS-B-only copy"
        ),
    ] = None
    # Names are resolved in validate(): a comma list is one item.
    tasks: Annotated[
        list[str] | None,
        Field(
            description="groups (all, sts, transfer, retrieval, geometry) or task names "
            "(STS12 … SICKRelatedness, MR … MRPC), each item a name or a comma list; null: "
            "all, or none when eval.retrieval_dir is given (a BEIR-only run)"
        ),
    ] = None
    retrieval_dir: Annotated[
        str | None,
        Field(
            description="a directory in the BEIR layout (corpus.jsonl, queries.jsonl, "
            "qrels/<split>.tsv) to score retrieval on: nDCG@10, MAP@100, R@1, R@10, R@100, MRR@10; "
            "null: none"
        ),
    ] = None
    retrieval_splits: Annotated[
        list[str] | None,
        Field(
            description="the splits (qrels/<split>.tsv) of eval.retrieval_dir to score; "
            "null: every split there"
        ),
    ] = None
    baseline_model: Annotated[
        str | None,
        Field(
            description="a second model scored on the same tasks; each STS task and retrieval "
            "split then reports candidate − baseline with its paired-bootstrap 95% interval; "
            "null: no comparison"
        ),
    ] = None


@section
class EvaluationConfig:
    # The one vocabulary: the model a job reads is model.path, its SentEval data
    # eval.senteval_dir, in every job.
    KEY_ALIASES: ClassVar[dict[str, str]] = {
        "model": "model.path",
        "senteval_dir": "eval.senteval_dir",
        "tasks": "eval.tasks",
    }

    model: EvaluatedModelConfig = field(default_factory=EvaluatedModelConfig)
    eval: TaskSelection = field(default_factory=TaskSelection)
    output: Annotated[
        str | None, Field(description="the results JSON to write; null: print only")
    ] = None
    encode: EncodeSettings = field(default_factory=EncodeSettings)
    # BEIR retrieval embeds queries and documents with these (the SentEval tasks are
    # symmetric: plain encode, the model's default prompt if it has one).
    prompts: PromptSettings = field(default_factory=PromptSettings)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    retrieval: RetrievalSettings = field(default_factory=RetrievalSettings)
    ray: RayConfig = field(default_factory=RayConfig)

    def validate(self) -> None:
        """What the declarations cannot say: the directories exist, the task names resolve,
        the lists hold a value, the object store fits this machine."""
        model, directory = self.model.path, self.eval.senteval_dir
        if model is not None and not Path(model).is_dir():
            raise ConfigError(f"model.path: {model} is not a model directory")
        if directory is not None and not Path(directory).is_dir():
            raise ConfigError(f"eval.senteval_dir: {directory} is not a directory")
        baseline = self.eval.baseline_model
        if baseline is not None and not Path(baseline).is_dir():
            raise ConfigError(f"eval.baseline_model: {baseline} is not a model directory")
        beir_dir, splits = self.eval.retrieval_dir, self.eval.retrieval_splits
        if beir_dir is not None:
            try:  # a directory, or the shipped set it names (shipped:news)
                beir.list_splits(beir_dir)
            except beir.BeirDataError as error:
                raise ConfigError(f"eval.retrieval_dir: {error}") from None
        if splits is not None and beir_dir is None:
            raise ConfigError("eval.retrieval_splits: given without eval.retrieval_dir")
        if splits is not None and not splits:
            raise ConfigError("eval.retrieval_splits: is empty; give a split or null (all)")
        if not self.retrieval.ks:
            raise ConfigError("retrieval.ks: is empty; give at least one k >= 1")
        self.transfer.validate("transfer")
        try:
            senteval_tasks(self.eval)
        except ValueError as err:
            raise ConfigError(f"eval.tasks: {err}") from None
        validate_ray_config(self.ray)


def senteval_tasks(selection: TaskSelection) -> dict[str, list[str]]:
    """The SentEval tasks to run, {group: [tasks]}: eval.tasks, or when it is unset every
    task — none when eval.retrieval_dir is given, so that a BEIR directory alone is a
    BEIR-only run."""
    if selection.tasks is None:
        return {} if selection.retrieval_dir else resolve_tasks(["all"])
    return resolve_tasks(selection.tasks)


def resolve_tasks(names: list[str]) -> dict[str, list[str]]:
    """Group and task names (``all``, ``sts``, ``MR``, ...) → {group: [tasks]} in table order."""
    wanted: set[str] = set()
    every = {t for tasks in GROUPS.values() for t in tasks}
    for raw in names:
        for name in (n.strip() for n in raw.split(",")):
            if not name:
                continue
            if name == "all":
                wanted |= every
            elif name in GROUPS:
                wanted |= set(GROUPS[name])
            elif name in every:
                wanted.add(name)
            else:
                raise ValueError(
                    f"unknown task {name!r}; expected all, {', '.join(GROUPS)} or one of "
                    f"{', '.join(sorted(every))}"
                )
    if not wanted:
        raise ValueError("no tasks selected")
    selected = {g: [t for t in tasks if t in wanted] for g, tasks in GROUPS.items()}
    return {g: tasks for g, tasks in selected.items() if tasks}


# --- one entry per task: files it needs, how to read it, its sentences, how to score it -----


@dataclass(frozen=True)
class TaskSpec:
    needed: list[str]  # files (relative to the SentEval dir) that must all be present
    load: Callable[[str], Any]
    sentences: Callable[[Any], list[str]]
    run: Callable[[Encoder, Any, EvaluationConfig], dict]


def _pairs_sentences(data) -> list[str]:
    return list(data.sentences1) + list(data.sentences2)


def _sts_single(encode: Encoder, data: sd.StsData, _config) -> dict:
    cosines = sts_cosines(encode, data)  # (n,)
    return {
        "spearman": spearman_x100(cosines, data.scores),
        "n": len(data),
        "per_pair": per_pair(cosines, data.scores),
    }


def _task_specs() -> dict[str, TaskSpec]:
    stsb_test = ["STS/STSBenchmark/sts-test.csv"]
    specs: dict[str, TaskSpec] = {
        year: TaskSpec(
            needed=sd.task_files(year),
            load=lambda d, year=year: sd.read_sts_year(d, year),
            sentences=lambda subsets: [s for x in subsets for s in _pairs_sentences(x)],
            run=lambda enc, subsets, _c: sts_subsets_spearman(enc, subsets),
        )
        for year in sd.STS_YEAR_SUBSETS
    }
    specs["STSBenchmark"] = TaskSpec(
        stsb_test, lambda d: sd.read_sts_benchmark(d, "test"), _pairs_sentences, _sts_single
    )
    specs["SICKRelatedness"] = TaskSpec(
        [f"SICK/{sd.SICK_FILES['test']}"],
        lambda d: sd.read_sick_relatedness(d, "test"),
        _pairs_sentences,
        _sts_single,
    )
    for task in sd.BINARY_TASK_FILES:
        specs[task] = TaskSpec(
            sd.task_files(task),
            lambda d, task=task: sd.read_binary_task(d, task),
            lambda data: list(data.sentences),
            lambda enc, data, c: evaluate_binary(enc, data, c.transfer),
        )
    specs["SST2"] = TaskSpec(
        sd.task_files("SST2"),
        lambda d: tuple(sd.read_sst2(d, s) for s in ("train", "dev", "test")),
        lambda parts: [s for p in parts for s in p.sentences],
        lambda enc, parts, c: evaluate_sst2(enc, *parts, c.transfer),
    )
    specs["TREC"] = TaskSpec(
        sd.task_files("TREC"),
        lambda d: (sd.read_trec(d, "train"), sd.read_trec(d, "test")),
        lambda parts: [s for p in parts for s in p.sentences],
        lambda enc, parts, c: evaluate_trec(enc, *parts, c.transfer),
    )
    specs["MRPC"] = TaskSpec(
        sd.task_files("MRPC"),
        lambda d: (sd.read_mrpc(d, "train"), sd.read_mrpc(d, "test")),
        lambda parts: [s for p in parts for s in _pairs_sentences(p)],
        lambda enc, parts, c: evaluate_mrpc(enc, *parts, c.transfer),
    )
    specs["STSBenchmark-retrieval"] = TaskSpec(
        stsb_test,
        lambda d: sd.read_sts_benchmark(d, "test"),
        _pairs_sentences,
        lambda enc, data, c: evaluate_retrieval(
            enc, sts_retrieval_task(data, c.retrieval.threshold), c.retrieval.ks
        ),
    )
    specs["STSBenchmark-geometry"] = TaskSpec(
        stsb_test,
        lambda d: sd.read_sts_benchmark(d, "test"),
        _pairs_sentences,
        lambda enc, data, c: sts_geometry(enc, data, c.retrieval.threshold),
    )
    return specs


TASK_SPECS = _task_specs()


def run_group(
    group: str,
    tasks: list[str],
    senteval_dir: str,
    encode: Encoder,
    config: EvaluationConfig,
    lookup: EmbeddingLookup | None = None,
) -> dict:
    """Read, embed (one pass) and score one group's tasks; skip absent ones.

    `lookup` carries embeddings over from earlier groups, so a sentence is embedded once per
    run (retrieval and geometry reuse STS-B test from the sts group)."""
    started = time.perf_counter()
    results: dict[str, dict] = {}
    skipped: list[dict] = []
    loaded: dict[str, Any] = {}
    for task in tasks:
        spec = TASK_SPECS[task]
        if not sd.task_present(senteval_dir, task, spec.needed):
            reason = f"no data in {senteval_dir} (expected {spec.needed[0]} ...)"
            log.warning("skipping %s: %s", task, reason)
            skipped.append({"task": task, "reason": reason})
            continue
        loaded[task] = spec.load(senteval_dir)
    read_s = time.perf_counter() - started
    timings: dict[str, float] = {"read_s": read_s}
    if loaded:
        sentences = [s for t, data in loaded.items() for s in TASK_SPECS[t].sentences(data)]
        if lookup is None:
            lookup = EmbeddingLookup([], np.zeros((0, 0), dtype=np.float32))
        start = time.perf_counter()
        n_new = lookup.extend(sentences, encode)
        timings["encode_s"] = time.perf_counter() - start
        timings["n_sentences_encoded"] = n_new
        log.info(
            "%s: embedded %d new distinct sentences in %.1f s", group, n_new, timings["encode_s"]
        )
        for task, data in loaded.items():
            start = time.perf_counter()
            results[task] = TASK_SPECS[task].run(lookup, data, config)
            results[task]["wall_s"] = time.perf_counter() - start
            log.info("%s done in %.1f s", task, results[task]["wall_s"])
    timings["total_s"] = time.perf_counter() - started
    return {"results": results, "skipped": skipped, "timing": timings}


def beir_splits(selection: TaskSelection) -> list[str]:
    """eval.retrieval_splits, or every split of eval.retrieval_dir; BeirDataError when there
    is none."""
    directory = selection.retrieval_dir
    splits = selection.retrieval_splits or beir.list_splits(directory)
    if not splits:
        raise beir.BeirDataError(
            f"{Path(directory) / beir.QRELS_DIR}: no <split>.tsv files; {beir.EXPECTED_LAYOUT}"
        )
    return splits


def run_beir(directory: str, splits: list[str], encode: beir.Encoders) -> dict:
    """Score every split of a BEIR directory, the corpus embedded (shard by shard) once for
    all of them; the split's per-query values are kept for paired comparisons. `encode`: one
    encoder, or (query encoder, document encoder) (beir.search)."""
    started = time.perf_counter()
    encode_s = 0.0

    def timed(encoder: Encoder) -> Encoder:
        def timed_encode(texts: list[str]) -> np.ndarray:
            nonlocal encode_s
            start = time.perf_counter()
            embeddings = encoder(texts)
            encode_s += time.perf_counter() - start
            return embeddings

        return timed_encode

    queries, documents = beir.query_and_document_encoders(encode)
    if queries is documents:
        timed_pair: beir.Encoders = timed(queries)
    else:
        timed_pair = (timed(queries), timed(documents))
    results = beir.evaluate_splits(timed_pair, directory, splits)
    for split, result in results.items():
        metrics = ", ".join(f"{name} {value:.2f}" for name, value in result["metrics"].items())
        log.info("BEIR %s (%d queries): %s", split, result["n_queries"], metrics)
    timing = {"encode_s": encode_s, "total_s": time.perf_counter() - started}
    return {"results": results, "timing": timing}


def encodes_with_ray(config: EvaluationConfig) -> bool:
    return use_encoding_pool(config.encode.use_ray, config.encode.concurrency, config.ray.address)


def evaluate(config: EvaluationConfig, encode: Encoder | None = None) -> dict:
    """Run the configured tasks; returns the JSON-ready results (see docs/EVALUATION.md).
    `encode`: one encoder for every text (no prompts); None: the model's, BEIR's queries and
    documents embedded with their prompts (prompts.*)."""
    config.validate()
    model = config.model.path or default_model_path()
    senteval_dir = config.eval.senteval_dir or shipped_senteval_dir()
    beir_encode: beir.Encoders | None = encode
    if encode is None:
        e = config.encode
        use_ray = encodes_with_ray(config)
        ray_options = (
            {
                "concurrency": e.concurrency,
                "num_cpus_per_actor": e.num_cpus_per_actor,
                "num_gpus_per_actor": e.num_gpus_per_actor,
                "torch_threads": e.torch_threads,
            }
            if use_ray
            else {}
        )
        encoders = make_encoders(
            model,
            e.pooler,
            e.batch_size,
            e.max_seq_length,
            use_ray=use_ray,
            query_prompt=config.prompts.query,
            document_prompt=config.prompts.document,
            **ray_options,
        )
        encode, beir_encode = encoders.plain, encoders.pair
    started = time.perf_counter()
    output: dict[str, Any] = {
        "model": model,
        "pooler": config.encode.pooler,
        "senteval_dir": senteval_dir,
        "config": asdict(config),
        "skipped": [],
        "wall_time_s": {},
    }
    lookup = EmbeddingLookup([], np.zeros((0, 0), dtype=np.float32))
    for group, tasks in senteval_tasks(config.eval).items():
        part = run_group(group, tasks, senteval_dir, encode, config, lookup)
        output[group] = part["results"]
        output["skipped"].extend(part["skipped"])
        output["wall_time_s"][group] = part["timing"]
    if config.eval.retrieval_dir:
        part = run_beir(config.eval.retrieval_dir, beir_splits(config.eval), beir_encode)
        output["retrieval_dir"] = config.eval.retrieval_dir
        if encode is not beir_encode:  # what was put before each query and each document
            output["prompts"] = applied_prompts(model, config.encode.pooler, config.prompts)
        output["beir"] = part["results"]
        output["wall_time_s"]["beir"] = part["timing"]
    output["wall_time_s"]["total_s"] = time.perf_counter() - started
    return output
