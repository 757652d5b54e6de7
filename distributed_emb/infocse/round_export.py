"""The rounds' export: the chosen round's model into `<output>/model` (and the state's
`model/` on a storage path), its card told what it is, and the line that says what was
exported.

A module of its own because what the export *is* has to be said in several places that must
agree: the console at the start (a student regime) and at the end, rounds.json's "exported",
and the model card (the regime, the given model handed back unchanged, the yardsticks against
the given model).
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path

from distributed_emb import storage
from distributed_emb.atomic_files import staged_directory
from distributed_emb.evaluation.yardsticks import compare_with_given, warning_lines, yardstick_lines
from distributed_emb.infocse.held_out_documents import HeldOut, documents_dir_of
from distributed_emb.infocse.round_evaluation import selection_name, selection_score, standing
from distributed_emb.infocse.round_records import RoundRecord
from distributed_emb.infocse.round_state import RoundState
from distributed_emb.infocse.rounds_config import InfoCSEConfig
from distributed_emb.model.model_card import PACKAGED_MODEL_ID, add_card_lines
from distributed_emb.model.sentence_transformer import (
    is_sentence_transformer_dir,
    load_sentence_transformer,
)
from distributed_emb.selection import given_model_round_line, is_given_model
from distributed_emb.train.driver import yardstick_encoders

log = logging.getLogger(__name__)

MODEL_DIR = "model"
CARD_FILE = "README.md"


def export_rounds(
    records: list[RoundRecord],
    best: RoundRecord,
    output: Path,
    config: InfoCSEConfig,
    state: RoundState,
    heldout: HeldOut | None,
) -> tuple[str, dict]:
    """Export `best` and compare it with the given model: (what was exported, the
    yardsticks)."""
    exported = exported_line(records, config)
    export_best(best, output, config, state, exported)
    yardsticks = compare_export(config, output / MODEL_DIR, heldout)
    card = output / MODEL_DIR / CARD_FILE
    if state.remote and card.is_file():
        # The comparison's lines reached the card after the model was put on storage.
        storage.copy_to_storage(card, state.location(MODEL_DIR, CARD_FILE))
    return exported, yardsticks


def export_best(
    best: RoundRecord,
    output: Path,
    config: InfoCSEConfig,
    state: RoundState,
    exported: str | None = None,
) -> None:
    """The best round's model into `output`/model (and the state's model/ on a storage
    path), its card told the regime (a student) and, when it is the given model unchanged,
    `exported` (exported_line)."""
    target = output / MODEL_DIR
    model_dir = storage.local_model_dir(best.model_dir)
    # Built beside model/ and swapped in: a crash mid-copy keeps the previous model/ whole
    # (it used to be deleted first, leaving nothing, or half a copy).
    with staged_directory(target) as staged:
        if best.stage == "initial" and not is_sentence_transformer_dir(model_dir):
            load_sentence_transformer(
                model_dir,
                pooler=config.training.model.pooler,
                max_seq_length=config.training.model.max_seq_length,
            ).save(str(staged))
        else:
            # dirs_exist_ok: the staging directory already exists (empty).
            shutil.copytree(model_dir, staged, dirs_exist_ok=True)
        notes = [regime_line(config, for_card=True)] if config.student.num_layers else []
        if is_given_model(exported):
            notes.append(exported)
        if notes:
            add_card_lines(staged, notes)
    if state.remote:
        storage.delete_tree(state.location(MODEL_DIR))
        storage.copy_to_storage(target, state.location(MODEL_DIR))
    where = f"{target} and {state.location(MODEL_DIR)}" if state.remote else str(target)
    if is_given_model(exported):
        log.warning("%s → %s", exported, where)
        return
    log.warning(
        "best: round %d (%s), %s %.2f → exported to %s",
        best.round,
        best.stage,
        selection_name(config),
        selection_score(best, config),
        where,
    )


def compare_export(config: InfoCSEConfig, exported_dir: Path, heldout: HeldOut | None) -> dict:
    """Both yardsticks of the export against the given model (model.path), on test splits
    with paired intervals (evaluation/yardsticks.py): logged one line each, with the warning
    line when topic fell, and put on the export's card."""
    training = copy.deepcopy(config.training)
    training.eval.documents_dir = documents_dir_of(heldout)
    compared = compare_with_given(
        training.model_path, str(exported_dir), training.eval, yardstick_encoders(training)
    )
    lines = [*yardstick_lines(compared), *warning_lines(compared)]
    for line in lines:
        log.warning("%s", line)
    if lines:
        add_card_lines(exported_dir, lines)
    return compared


def exported_line(records: list[RoundRecord], config: InfoCSEConfig) -> str:
    """What the rounds export, for rounds.json's "exported" and the job's last lines: "round
    <r> (<stage>)", or, when no round beat round 0 and round 0 is model.path itself (no
    student), the one line that says the given model is handed back unchanged."""
    best, _ = standing(records, config)
    if best.stage != "initial" or config.student.num_layers is not None:
        return f"round {best.round} ({best.stage})"
    last_of_round = {r.round: r for r in records[1:]}  # a round is judged by its last record
    top = max(last_of_round.values(), key=lambda r: selection_score(r, config), default=None)
    return given_model_round_line(
        selection_name(config),
        top.round if top is not None else None,
        selection_score(top, config) if top is not None else None,
        selection_score(best, config),
        config.rounds.min_improvement,
    )


def regime_line(config: InfoCSEConfig, for_card: bool = False) -> str:
    """The student regime in one line (student.num_layers set): the console at the start of
    the rounds, and the export's card (`for_card`: the model's name, no local path)."""
    source = config.training.model.path
    name = PACKAGED_MODEL_ID if source is None else source
    if for_card and source is not None and Path(source).exists():
        name = Path(source).name
    total = _layer_count(config.training.model_path)
    layers = config.student.num_layers
    cut = f"the first {layers} of {total} layers" if total else f"the first {layers} layers"
    return f"regime: student — {cut} of {name}; the export is the student, not the given model"


def _layer_count(model_dir: str) -> int | None:
    """The transformer layers of a local model (its config.json); None when it does not say."""
    config_file = Path(model_dir) / "config.json"
    if not config_file.is_file():
        return None
    return json.loads(config_file.read_text()).get("num_hidden_layers")
