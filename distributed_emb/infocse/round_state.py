"""Where an InfoCSE run keeps its rounds' state, and how a restarted run continues.

Every node of a cluster must reach what a round leaves for the next one (its model, its
pairs), so that state lives under one *root*: `<output.storage_path>/<run name>` when
a storage path is set (s3://, gs://, or a directory every node mounts), else the job's output
directory (one machine). Under the root:

    rounds.json, rounds.md          finished rounds (the resume state) and their table
    model/                          the best round's model
    rounds.png, teacher.json        the plot of the rounds, the teacher's scores (storage only)
    logs/                           the driver's run.log, rounds_log.jsonl, tensorboard/
                                    (storage only: tracking.StoredLogs; round_records.py)
    round_<r>/pairs/                the round's mined pairs (Parquet shards, annotation.py)
    round_<r>/pairs_source.json     written once the pairs are complete: where they are, their
                                    counts, which model mined them (the commit of the pairs)
    round_<r>/next_round_pairs/     rounds.overlap: pairs mined while round r trains
    round_<r>/train/                the round's training logs (run.log, metrics.json, ...)

Round r's training is its own Ray Train run, `<run name>-round_<r>-train`, beside the root on
the storage path (or under round_<r>/train/ on one machine): its checkpoints, metrics.json and
exported model are there.

A restarted run reads rounds.json: the finished rounds are not run again; a round whose pairs
were committed is not annotated again; its training continues from the round's last
checkpoint (Ray Train's restore, output.resume=auto). Rounds of a run with other settings are
refused, naming the keys that differ, unless `output.resume=overwrite`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import asdict

from distributed_emb import storage
from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, to_dict
from distributed_emb.settings import flatten
from distributed_emb.tracking import LOGS_DIR
from distributed_emb.train.run_identity import differences, identity

log = logging.getLogger(__name__)

ROUNDS_FILE = "rounds.json"
TEACHER_FILE = "teacher.json"
PAIRS_SOURCE_FILE = "pairs_source.json"

# Annotation keys that change where and how fast it runs, not the pairs it mines.
_ANNOTATION_RUNTIME_KEYS = (
    "annotation.encode_batch_size",
    "annotation.documents_per_batch",
    "annotation.concurrency",
    "annotation.num_cpus_per_actor",
    "annotation.num_gpus_per_actor",
    "annotation.torch_threads",
    "annotation.stall_timeout_s",
)


def rounds_settings(config) -> dict:
    """The settings that make a finished round what it is: the documents, the annotation,
    the student, the held-out split, the supervised steps, the overlap and the rounds'
    training (its run identity: train/run_identity.py). Not the stopping rule (max_rounds,
    patience): a run may be continued with more rounds."""
    tree = to_dict(config)
    flat = dict(identity({f.name: tree[f.name] for f in dataclasses.fields(TrainingConfig)}))
    for section in ("documents", "annotation", "student", "heldout", "supervised"):
        flat.update(flatten(tree[section], f"{section}."))
    for key in ("overlap", "retrieval_threshold", "select_by"):
        if key in tree["rounds"]:
            flat[f"rounds.{key}"] = tree["rounds"][key]
    return {k: v for k, v in sorted(flat.items()) if k not in _ANNOTATION_RUNTIME_KEYS}


class RoundState:
    """The rounds' state under `root` (a local path or an object-storage URI)."""

    def __init__(self, root: str, remote: bool) -> None:
        self.root = root
        # True: the state is on a storage path, and the driver's output directory keeps
        # only logs and a copy of the final model.
        self.remote = remote

    def location(self, *parts: str) -> str:
        return storage.join(self.root, *parts)

    def round_dir(self, index: int) -> str:
        return self.location(f"round_{index}")

    # The pairs of one round --------------------------------------------------------------

    def pairs_source(self, index: int) -> dict | None:
        """What round `index`'s committed pairs are (None: not committed)."""
        text = storage.read_text(storage.join(self.round_dir(index), PAIRS_SOURCE_FILE))
        return json.loads(text) if text else None

    def commit_pairs(self, index: int, source: dict) -> None:
        storage.write_text(
            storage.join(self.round_dir(index), PAIRS_SOURCE_FILE), json.dumps(source, indent=2)
        )

    # The finished rounds -----------------------------------------------------------------

    def finished(self, config, overwrite: bool) -> dict | None:
        """rounds.json of an earlier run with these settings (None: none, or `overwrite`,
        which deletes what an earlier run left). Another run's rounds are refused."""
        text = storage.read_text(self.location(ROUNDS_FILE))
        if overwrite:
            if text is not None or storage.has_files(self.root):
                log.warning("output.resume=overwrite: deleting the rounds in %s",
                            self.root)  # fmt: skip
                self._delete_rounds()
            return None
        if text is None:
            return None
        saved = json.loads(text)
        changes = differences(saved.get("settings", {}), rounds_settings(config))
        if changes:
            raise ConfigError(
                f"{self.location(ROUNDS_FILE)} holds the rounds of a run with other settings: "
                f"{', '.join(changes)}; pass output.resume=overwrite to delete them, "
                f"or choose another output.run_name (or output directory)"
            )
        return saved

    def save(self, config, records: list, best, table: str, summary: dict | None = None) -> None:
        """`summary`: keys beside the rounds (round_records.py: the regime, what was
        exported)."""
        payload = {
            "settings": rounds_settings(config),
            "rounds": [asdict(r) for r in records],
            "best": asdict(best),
            **(summary or {}),
        }
        storage.write_text(self.location(ROUNDS_FILE), json.dumps(payload, indent=2))
        storage.write_text(self.location("rounds.md"), table + "\n")

    def _delete_rounds(self) -> None:
        for name in (ROUNDS_FILE, "rounds.md"):
            storage.delete_file(self.location(name))
        storage.delete_tree(self.location("model"))
        if self.remote:
            # The earlier run's log parts would be merged into this run's run.log, and its
            # teacher's scores would stand beside rounds that had none.
            storage.delete_tree(self.location(LOGS_DIR))
            storage.delete_file(self.location(TEACHER_FILE))
        for directory in storage.list_dirs(self.root):
            if directory.rsplit("/", 1)[-1].startswith("round_"):
                storage.delete_tree(directory)
