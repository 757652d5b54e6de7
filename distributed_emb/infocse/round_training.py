"""A round's training: the core trainer (train/driver.py) on the round's pairs, as a Ray Train
run of its own, and InfoCSE++'s supervised step after it.

Each stage of each round is its own run (`<run name>-round_<r>-train`, `-supervised`), so that
with a shared storage path no round resumes another's checkpoints; where its files go on the
driver and what of them outlives a cluster's node is decided here too.
"""

from __future__ import annotations

import copy
import logging
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from distributed_emb import storage
from distributed_emb.config import TrainingConfig
from distributed_emb.evaluation.senteval_data import read_sick_relatedness, read_sts_benchmark
from distributed_emb.infocse.held_out_documents import HeldOut, documents_dir_of
from distributed_emb.infocse.round_evaluation import evaluate_dev
from distributed_emb.infocse.round_records import RoundRecord, score_fields, training_fields
from distributed_emb.infocse.round_state import RoundState
from distributed_emb.infocse.rounds_config import InfoCSEConfig
from distributed_emb.paths import shipped_senteval_dir
from distributed_emb.train.driver import run_training

log = logging.getLogger(__name__)


def base_run_name(config: InfoCSEConfig) -> str:
    return config.training.output.run_name or Path(config.output.dir).name


def train_stage(training: TrainingConfig, callbacks: list | None = None):
    """One core-trainer run of a round (its config from :func:`training_config`)."""
    # The training's step and evaluation lines go to its own run.log (rank 0 writes it).
    log.info("%s: training, step lines in %s", training.output.run_name,
             Path(training.output.dir) / "run.log")  # fmt: skip
    return run_training(training, callbacks=callbacks)


def training_config(
    config: InfoCSEConfig,
    model_dir: str,
    pairs_path: str,
    output_dir: str,
    stage_name: str,
    overrides: dict | None = None,
    resume: str = "overwrite",
) -> TrainingConfig:
    """The core trainer's config for one round's training on `pairs_path` from `model_dir`."""
    training = copy.deepcopy(config.training)
    training.model.path = model_dir
    training.data.path = pairs_path
    training.data.kind = "pairs"
    training.data.group_column = "doc_id"
    # The pairs are written in an order spread over documents (annotation_tables.spread_keys);
    # the stream permutes files and rows within blocks on top, from the training seed.
    training.data.shuffle_seed = training.train.seed
    training.output.dir = output_dir
    # One Ray Train run per round and stage ("<name>-round_2-train"): with a shared
    # output.storage_path, a round must never find (and resume) another round's checkpoints.
    # A round started afresh deletes what an earlier attempt of it left ("overwrite"); a round
    # whose pairs an earlier attempt committed continues that attempt's training ("auto").
    training.output.run_name = f"{base_run_name(config)}-{stage_name}"
    training.output.resume = resume
    # The round's model is its training's best trained checkpoint, even when worse than the
    # model it started from: the next round re-annotates with it, and the rounds decide
    # (patience) and export the best of all rounds, the initial model included.
    training.eval.start_is_candidate = False
    training.eval.score_start = False  # the start is scored outside this training
    for section_key, value in (overrides or {}).items():
        section, key = section_key.split(".")
        setattr(getattr(training, section), key, value)
    return training


def round_training_config(
    config: InfoCSEConfig,
    index: int,
    model_dir: str,
    pairs_path: str,
    output: Path,
    state: RoundState,
    heldout: HeldOut | None,
    continued: bool,
) -> TrainingConfig:
    """Round `index`'s InfoCSE training from `model_dir` on its pairs; `continued`: its pairs
    were committed by an earlier attempt, whose training it continues."""
    return training_config(
        config, model_dir, pairs_path, str(stage_dir(state, output, index, "train", continued)),
        f"round_{index}-train", {"eval.documents_dir": documents_dir_of(heldout)},
        resume="auto" if continued else "overwrite",
    )  # fmt: skip


def stage_dir(
    state: RoundState, output: Path, index: int, stage: str, continued: bool = False
) -> Path:
    """Where a round's training writes on the driver: inside the output directory on one
    machine; with a storage path, a scratch directory that keep_stage empties onto it. A
    continued round's earlier results there are dropped: its training writes them again."""
    if state.remote:
        return Path(tempfile.mkdtemp(prefix=f"round_{index}-{stage}-"))
    directory = output / f"round_{index}" / stage
    if continued:
        shutil.rmtree(directory / "model", ignore_errors=True)
        (directory / "metrics.json").unlink(missing_ok=True)
    return directory


def keep_stage(state: RoundState, result, training: TrainingConfig, index: int, stage: str) -> str:
    """The stage's model location for the next round. With a storage path: the model the
    training put beside its checkpoints there, its logs copied to round_<index>/<stage> of
    the state, and the driver's scratch copy removed."""
    if not state.remote:
        return result.model_dir
    train_dir = Path(training.output.dir)
    shutil.rmtree(train_dir / "model", ignore_errors=True)
    storage.copy_to_storage(train_dir, storage.join(state.round_dir(index), stage))
    shutil.rmtree(train_dir, ignore_errors=True)
    return result.metrics["model_uri"]


# InfoCSE++ -----------------------------------------------------------------------------------


def supervised_pairs_file(config: InfoCSEConfig, location: str) -> int:
    """InfoCSE++ labelled positives: train pairs with gold score ≥ threshold, each its own
    group, written to `location` (a local path or on the storage path: Train workers on any
    node read it)."""

    senteval = config.training.eval.senteval_dir or shipped_senteval_dir()
    s = config.supervised
    data = (
        read_sts_benchmark(senteval, "train")
        if s.source == "stsb"
        else read_sick_relatedness(senteval, "train")
    )
    keep = [i for i, score in enumerate(data.scores) if score >= s.score_threshold]
    table = pa.table(
        {
            "anchor": [data.sentences1[i] for i in keep],
            "positive": [data.sentences2[i] for i in keep],
            "doc_id": [f"{s.source}-{i}" for i in keep],
        }
    )
    with tempfile.TemporaryDirectory() as scratch:
        local = Path(scratch) / "supervised_pairs.parquet"
        pq.write_table(table, local)
        storage.copy_to_storage(local, location)
    return len(keep)


def supervised_step(
    config: InfoCSEConfig,
    index: int,
    model_dir: str,
    state: RoundState,
    output: Path,
    heldout: HeldOut | None,
) -> RoundRecord:
    """InfoCSE++: round `index`'s model fine-tuned on labelled pairs, and scored."""
    pairs_file = storage.join(state.round_dir(index), "supervised_pairs.parquet")
    count = supervised_pairs_file(config, pairs_file)
    s = config.supervised
    training = training_config(
        config,
        model_dir,
        pairs_file,
        str(stage_dir(state, output, index, "supervised")),
        f"round_{index}-supervised",
        {
            "train.max_steps": s.max_steps,
            "train.learning_rate": s.learning_rate,
            "eval.documents_dir": documents_dir_of(heldout),
        },
    )
    result = train_stage(training)
    scores = evaluate_dev(result.model_dir, config, heldout)
    return RoundRecord(
        index,
        "supervised",
        keep_stage(state, result, training, index, "supervised"),
        pairs=count,
        **training_fields(result.metrics),
        **score_fields(scores),
    )
