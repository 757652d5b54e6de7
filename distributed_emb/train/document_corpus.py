"""A training run on documents (`documents.paths`): the held-out documents become the run's
document-level yardstick, the others' sentences its training corpus.

    documents ──Ray Data──► held out (heldout.*, by a hash of the id) ──► yardstick (BEIR dir)
                     └────► the rest, one row per sentence {text, doc_id} ──► Parquet (data.path)

Both are derived data, written once under the token cache's root (`documents-<key>/`, on the
storage path when there is one) and reused while the documents and the settings that decide
them are the same: a resubmitted or resumed run trains the same files, so its stream and data
position stay valid. The key hashes the document files' listing (paths, sizes, modification
times, as the token cache keys a corpus), their columns and rules, and `heldout.*`.
train/driver.py `train_on_documents` points a run's data.path and eval.documents_dir at them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from distributed_emb import storage
from distributed_emb.data.documents import DocumentsConfig, read_documents
from distributed_emb.data.held_out import HeldOutConfig, split_held_out
from distributed_emb.data.token_cache import sources_fingerprint
from distributed_emb.evaluation.document_topics import write_held_out_yardstick

log = logging.getLogger(__name__)

COMPLETE = "_COMPLETE"  # written last: a directory without it is an interrupted preparation
TRAIN_DIR = "train"
EVAL_DIR = "eval"
TEXT_COLUMN = "text"


@dataclass(frozen=True)
class PreparedDocuments:
    sentences: str  # the training sentences' directory ({text, doc_id} Parquet files)
    yardstick: str | None  # the held-out documents' BEIR directory; None: none had 2 passages


def documents_key(documents: DocumentsConfig, heldout: HeldOutConfig) -> str:
    """What decides the prepared files, hashed (see the module docstring)."""
    decided = {
        "files": sources_fingerprint(documents.paths, documents.hf_split),
        "documents": dataclasses.asdict(documents),
        "heldout": dataclasses.asdict(heldout),
    }
    text = json.dumps(decided, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prepare_documents(
    documents: DocumentsConfig, heldout: HeldOutConfig, cache_root: str
) -> PreparedDocuments:
    """The training sentences and the yardstick of `documents`, prepared under `cache_root`
    unless they are there already. Needs Ray (the documents are read and split by Ray Data
    tasks; only the held-out ones come to this process)."""
    root = storage.join(cache_root, f"documents-{documents_key(documents, heldout)}")
    train_dir, eval_dir = storage.join(root, TRAIN_DIR), storage.join(root, EVAL_DIR)
    if storage.exists(storage.join(root, COMPLETE)):
        log.warning("documents: reusing the prepared sentences and held-out yardstick in %s", root)
    else:
        _prepare(documents, heldout, root, train_dir, eval_dir)
    has_yardstick = storage.exists(storage.join(eval_dir, "README.md"))
    return PreparedDocuments(train_dir, eval_dir if has_yardstick else None)


def _prepare(
    documents: DocumentsConfig, heldout: HeldOutConfig, root: str, train_dir: str, eval_dir: str
) -> None:
    storage.delete_tree(root)  # what an interrupted preparation left
    corpus = read_documents(documents)
    training, held = split_held_out(corpus.dataset, heldout)
    sentences = training.flat_map(_sentence_rows)
    # One order on every run: the files, and so the stream built from them, are the same
    # whenever the documents are.
    sentences.context.execution_options.preserve_order = True
    # No CPU reserved for the write tasks: an on-demand head offers none. A local directory
    # is written on this node (local://), where the run reads it.
    sentences.write_parquet(
        train_dir if "://" in train_dir else f"local://{Path(train_dir).resolve()}",
        ray_remote_args={"num_cpus": 0},
    )
    held_rows = held["dev"] + held["test"]
    with tempfile.TemporaryDirectory() as scratch:
        written = write_held_out_yardstick(
            held_rows, heldout, documents.paths, Path(scratch) / EVAL_DIR
        )
        if written is not None:
            storage.copy_to_storage(written, eval_dir)
    storage.write_text(storage.join(root, COMPLETE), "")
    log.warning(
        "documents: %d held out (dev %d, test %d), the others' sentences in %s",
        len(held_rows), len(held["dev"]), len(held["test"]), train_dir,
    )  # fmt: skip


def _sentence_rows(document: dict) -> list[dict]:
    return [{TEXT_COLUMN: text, "doc_id": document["doc_id"]} for text in document["sentences"]]
