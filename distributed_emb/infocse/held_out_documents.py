"""The rounds' held-out documents: never annotated or trained on, scored every round.

The split itself is the shared one (data/held_out.py: by a hash of doc_id, decided row by row
in Ray Data tasks). What the rounds make of the held-out side is here: a same-document
retrieval task per half (dev chooses with rounds.select_by=heldout_dev_mrr, test is
reported) and the document-level yardstick (evaluation/document_topics.py) written where every
node reads it. compare.py scores its arms on the same tasks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from distributed_emb import storage
from distributed_emb.data.held_out import split_held_out
from distributed_emb.evaluation.document_retrieval import SameDocumentTask
from distributed_emb.evaluation.document_topics import write_held_out_yardstick
from distributed_emb.infocse.round_state import RoundState
from distributed_emb.infocse.rounds_config import InfoCSEConfig
from distributed_emb.selection import documents_split

log = logging.getLogger(__name__)

DOCUMENTS_EVAL_DIR = "documents_eval"


@dataclass
class HeldOut:
    """Same-document retrieval tasks on the two halves of the held-out documents, and the
    document-level yardstick built from them (a BEIR directory, local or on storage)."""

    dev: SameDocumentTask | None
    test: SameDocumentTask | None
    documents_dir: str | None = None


def documents_dir_of(heldout: HeldOut | None) -> str | None:
    """The rounds' document-level yardstick: their own held-out documents' (never the shipped
    example, which may hold documents the rounds train on); None without held-out documents."""
    return heldout.documents_dir if heldout is not None else None


def split_held_out_documents(dataset, config: InfoCSEConfig, output: Path, state: RoundState):
    """(the documents to annotate and train on, HeldOut or None).

    Held-out documents never reach annotation or training. Only they come to the driver,
    which scores them: the dev half chooses rounds (rounds.select_by=heldout_dev_mrr), the
    test half is reported."""
    h = config.heldout
    if h.fraction == 0:
        return dataset, None
    training, held = split_held_out(dataset, h)
    tasks, held_rows = {}, []
    for split, split_rows in held.items():
        held_rows += split_rows
        try:
            tasks[split] = SameDocumentTask.from_documents(
                split_rows, h.max_sentences_per_document, f"heldout-{split}"
            )
        except ValueError:
            log.warning("heldout: no %s document has 2 sentences; no %s retrieval", split, split)
            tasks[split] = None
    documents_dir = _write_document_yardstick(held_rows, config, output, state)
    if tasks["dev"] is None and tasks["test"] is None and documents_dir is None:
        return training, None
    log.warning(
        "heldout: documents held out of training, scored by same-document retrieval: dev %s, "
        "test %s", *(_task_size(tasks[split]) for split in ("dev", "test")),
    )  # fmt: skip
    return training, HeldOut(tasks["dev"], tasks["test"], documents_dir)


def require_held_out_to_choose(config: InfoCSEConfig, heldout: HeldOut | None) -> None:
    """A run that chooses on held-out documents fails here, before any round, when the
    split left none to choose on."""
    if config.rounds.select_by.startswith("heldout_dev") and (
        heldout is None or heldout.dev is None
    ):
        raise ValueError(
            f"rounds.select_by={config.rounds.select_by}: no held-out dev document has 2 "
            f"sentences (heldout.fraction={config.heldout.fraction} of {config.documents.paths}); "
            "raise heldout.fraction or choose rounds by stsb_dev"
        )
    if documents_split(config.training.eval.select_by) and documents_dir_of(heldout) is None:
        raise ValueError(
            f"eval.select_by={config.training.eval.select_by}: no held-out document has 2 "
            f"passages (heldout.fraction={config.heldout.fraction} of {config.documents.paths}); "
            "raise heldout.fraction or choose by stsb_dev"
        )


def _write_document_yardstick(
    held_rows: list[dict], config: InfoCSEConfig, output: Path, state: RoundState
) -> str | None:
    """The document-level yardstick (evaluation/document_topics.py) built from the held-out
    documents into `output`/documents_eval (and the state's, on a storage path, where Train
    workers on any node read it); None, logged, when no held-out document has 2 passages."""
    local = write_held_out_yardstick(
        held_rows, config.heldout, config.documents.paths, output / DOCUMENTS_EVAL_DIR
    )
    if local is None or not state.remote:
        return local
    location = state.location(DOCUMENTS_EVAL_DIR)
    storage.delete_tree(location)
    return storage.copy_to_storage(local, location)


def _task_size(task: SameDocumentTask | None) -> str:
    if task is None:
        return "none"
    return f"{task.num_documents} documents ({len(task.sentences)} queries)"
