"""Each round's pairs, wherever they come from: mined before the round trains (by the teacher
or by the model being trained), taken over from an earlier attempt of this run that committed
them, or, with rounds.overlap, mined while the previous round trained (overlap.py) and adopted.

Every choice is committed in the rounds' state (pairs_source.json) before the round trains on
it: that commit is what lets a restarted run continue a round instead of mining it again. The
loop (rounds.py) asks for a round's pairs in one call; which path gave them is kept here.
"""

from __future__ import annotations

import copy
import logging
import tempfile
import time
from dataclasses import asdict, dataclass

from distributed_emb import storage
from distributed_emb.config import TrainingConfig
from distributed_emb.infocse.annotate import AnnotationResult, annotate_documents
from distributed_emb.infocse.annotation_tables import AnnotationCounts
from distributed_emb.infocse.overlap import (
    NextRoundAnnotator,
    PairVersion,
    PairVersions,
    follow_training,
)
from distributed_emb.infocse.pairs import pair_overlap_on_cluster
from distributed_emb.infocse.round_records import RoundRecord
from distributed_emb.infocse.round_state import RoundState
from distributed_emb.infocse.rounds_config import InfoCSEConfig
from distributed_emb.model.sentence_transformer import load_sentence_transformer
from distributed_emb.train.driver import export_checkpoint

log = logging.getLogger(__name__)


@dataclass
class RoundPairs:
    """What a round trains on, and where it came from."""

    annotation: AnnotationResult  # the counts, the time, where the pairs are
    source: dict  # as committed (pairs_source.json)
    annotated_by: str  # "teacher" or "self" (the model trained this round)
    continued: bool  # committed by an earlier attempt: its training continues too
    overlap_with_previous: float | None  # Jaccard with the previous round's pairs


@dataclass
class _Mined:
    """The next round's pairs, mined while the last round trained."""

    version: PairVersion
    versions: PairVersions
    waited_s: float  # how long the round's end waited for them


class RoundAnnotator:
    """The rounds' pairs, one round after another, for the documents of one run."""

    def __init__(
        self,
        config: InfoCSEConfig,
        documents,
        teacher: str | None,
        state: RoundState,
        records: list[RoundRecord],
    ) -> None:
        """`records`: the rounds so far (round 0, and an earlier attempt's)."""
        self.config, self.documents, self.teacher, self.state = config, documents, teacher, state
        self.settings = with_fixed_length(config.annotation, records[0].model_dir)
        self._previous = next(
            (r.pairs_location for r in reversed(records) if r.stage == "infocse"), None
        )
        self._follower: NextRoundAnnotator | None = None
        self._mined: _Mined | None = None

    def pairs(self, index: int, model_dir: str) -> RoundPairs:
        """Round `index`'s pairs, committed: an earlier attempt's, the ones mined while the
        last round trained, or mined now (by the teacher, else by `model_dir`)."""
        by_teacher = self.teacher is not None and index <= self.config.annotation.teacher_rounds
        source = self.state.pairs_source(index)
        continued = source is not None
        if continued:
            annotation = AnnotationResult(
                AnnotationCounts(**source["counts"]), source["annotate_s"], source["pairs"]
            )
            log.warning(
                "round %d: its pairs were committed by an earlier attempt (%s): training "
                "continues from its last checkpoint", index, source["pairs"],
            )  # fmt: skip
        elif self._mined is not None:
            annotation, source = self._adopt(self._mined, index)
        else:
            annotation, source = self._annotate(index, self.teacher if by_teacher else model_dir)
        self._mined = None
        overlap = None
        if self._previous is not None:
            overlap = pair_overlap_on_cluster(self._previous, annotation.pairs_path).jaccard
        self._previous = annotation.pairs_path
        return RoundPairs(
            annotation, source, "teacher" if by_teacher else "self", continued, overlap
        )

    def mine_next_while_training(
        self, index: int, training: TrainingConfig, worth_mining
    ) -> list | None:
        """rounds.overlap: start mining round index+1's pairs with round `index`'s best
        checkpoint so far, as its training registers them. Returns the training's callbacks
        (None: this round does not overlap)."""
        if not self._overlaps(index):
            return None
        self._follower = _follow_training(
            self.documents, self.settings, index, self.state, training, worth_mining
        )
        return [self._follower.feed]

    def stop_mining(self) -> None:
        """No next round will read the pairs being mined (the round failed, or the rounds
        stop): the mining thread and its Ray queue are released without waiting."""
        if self._follower is not None:
            self._follower.close(timeout_s=0)
            self._follower = None

    def collect_mined(self, kept_step: int | None) -> None:
        """The round is done (trained and scored, which the mining overlapped too): wait for
        the pairs mined with its kept step, which the next round then adopts."""
        if self._follower is None:
            return
        started = time.perf_counter()
        version = self._follower.finish(kept_step)
        if version is not None:
            waited = time.perf_counter() - started
            self._mined = _Mined(version, self._follower.versions, waited)
        self._follower = None

    def _overlaps(self, index: int) -> bool:
        # Only when a next round exists and is annotated by the model being trained.
        config = self.config
        next_by_teacher = self.teacher is not None and index + 1 <= config.annotation.teacher_rounds
        return config.rounds.overlap and index < config.rounds.max_rounds and not next_by_teacher

    def _annotate(self, index: int, model_dir: str) -> tuple[AnnotationResult, dict]:
        pairs_location = storage.join(self.state.round_dir(index), "pairs")
        storage.delete_tree(pairs_location)  # what an interrupted annotation left
        annotation = annotate_documents(
            self.documents, model_dir, pairs_location, index, self.settings
        )
        source = {
            "pairs": pairs_location,
            "counts": asdict(annotation.counts),
            "annotate_s": round(annotation.wall_seconds, 1),
            "mined_at_step": None,
        }
        self.state.commit_pairs(index, source)
        return annotation, source

    def _adopt(self, mined: _Mined, index: int) -> tuple[AnnotationResult, dict]:
        """Round `index` trains on the mined version's pairs where they are (nothing is moved:
        on object storage a move is a copy); the other versions and the mining models are
        deleted, and the choice is committed as the round's pairs."""
        version = mined.version
        mined.versions.discard_except(version.step)
        source = {
            "pairs": version.pairs_dir,
            "counts": asdict(version.counts),
            "annotate_s": round(mined.waited_s, 1),
            "mined_at_step": version.step,
            "score": version.score,
            "overlapped_annotate_s": version.annotate_s,
        }
        self.state.commit_pairs(index, source)
        log.warning(
            "pairs mined while the previous round trained, with its step %d (%.0f s of "
            "annotation, %.0f s waited for after it)", version.step, version.annotate_s,
            mined.waited_s,
        )  # fmt: skip
        return AnnotationResult(version.counts, mined.waited_s, version.pairs_dir), source


def with_fixed_length(annotation, initial_model: str):
    """The annotation config with max_seq_length resolved once, from the initial model when
    unset: a round's export carries the *training* max length (e.g. 32), so "the model's own"
    would otherwise silently shorten what later rounds cluster on."""

    if annotation.max_seq_length is not None:
        return annotation
    fixed = copy.deepcopy(annotation)
    fixed.max_seq_length = load_sentence_transformer(
        initial_model, pooler=annotation.pooler, device="cpu"
    ).max_seq_length
    log.info("annotating every round at max_seq_length=%s", fixed.max_seq_length)
    return fixed


def _follow_training(
    documents,
    annotation_config,
    index: int,
    state: RoundState,
    training: TrainingConfig,
    worth_mining,
) -> NextRoundAnnotator:
    """Start mining round index+1's pairs with round `index`'s best checkpoint so far, as its
    training registers checkpoints (infocse/overlap.py), into
    `round_<index>/next_round_pairs` of the rounds' state."""

    def mine(report, directory: str):
        model_location = storage.join(directory, "model")
        # The checkpoint is copied into a directory of this thread's own: `as_directory` of a
        # checkpoint on object storage shares one temp directory per checkpoint in the
        # process, and the training's driver reads the same checkpoint at the same time (the
        # one it ends on), so one side deleted it under the other.
        with tempfile.TemporaryDirectory() as scratch:
            checkpoint_dir = report.checkpoint.to_directory(f"{scratch}/checkpoint")
            if state.remote:  # exported here, then put where the actors' nodes reach it
                local = export_checkpoint(training, checkpoint_dir, f"{scratch}/model")
                storage.copy_to_storage(local, model_location)
            else:
                export_checkpoint(training, checkpoint_dir, model_location)
        pairs_location = storage.join(directory, "pairs")
        result = annotate_documents(
            documents, model_location, pairs_location, index + 1, annotation_config,
            reserve_cpus=False,
        )  # fmt: skip
        return pairs_location, result.counts

    versions = PairVersions(storage.join(state.round_dir(index), "next_round_pairs"))
    return follow_training(versions, mine, worth_mining)
