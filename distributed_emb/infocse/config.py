"""InfoCSE run configuration: the training settings every round trains with (model, data, loss,
train, eval, output, ray, logging, export: the same keys as the training job), plus documents,
annotation, the stopping rule and optional InfoCSE++ supervised rounds. Loaded with
`distributed_emb.config.load_config`."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field

from distributed_emb.config import (
    OutputConfig,
    TrainingConfig,
    _require,
    require_range,
    require_seed,
    require_sources,
    training_sections,
)
from distributed_emb.data.documents import DocumentsConfig
from distributed_emb.infocse.annotate import AnnotationConfig


@dataclass
class RoundsConfig:
    max_rounds: int = 3
    # Rounds without a new best dev score before stopping. 2: one short round is a noisy
    # signal; the second re-annotates with the first round's model before giving up.
    patience: int = 2
    min_improvement: float = 0.0  # Spearman points a round must gain to count as better
    retrieval_threshold: float = 4.0  # STS-B dev pairs scored ≥ this form the retrieval dev set
    # Also score every round's model on STS-B test (reported only; never used to choose).
    stsb_test: bool = False
    # The dev score that chooses the exported round and stops the rounds: "stsb_dev" (STS-B
    # dev Spearman), or "heldout_dev_mrr" (same-document retrieval MRR on the dev half of the
    # held-out documents: the in-domain metric InfoCSE is for; needs heldout.fraction > 0).
    # The held-out test half and STS-B are reported beside it, never used to choose.
    select_by: typing.Literal["stsb_dev", "heldout_dev_mrr"] = "stsb_dev"
    # Mine the next round's pairs while this round trains, with its best checkpoint so far
    # (infocse/overlap.py); the next round uses the pairs of the checkpoint it keeps, else the
    # freshest ones. Not with InfoCSE++ (its rounds annotate with the supervised model).
    overlap: bool = False


@dataclass
class SupervisedConfig:
    """InfoCSE++: after each unsupervised round, fine-tune on labelled pairs."""

    enabled: bool = False
    source: str = "stsb"  # "stsb" or "sick" train split, from eval.senteval_dir
    score_threshold: float = 4.0  # pairs with gold score ≥ this are positives
    max_steps: int = 50
    learning_rate: float = 1.0e-5


@dataclass
class StudentConfig:
    """The trained model (the student): `model.path` itself, or its first `num_layers`
    transformer layers (infocse/student.py), built offline into the rounds' `student/`."""

    num_layers: int | None = None  # None: train model.path itself


@dataclass
class HeldOutConfig:
    """Documents held out of annotation and training, scored every round by same-document
    retrieval (evaluation/document_retrieval.py): the InfoCSE paper's in-domain metric."""

    fraction: float = 0.1  # share of documents held out (by a hash of doc_id); 0: none
    seed: int = 0
    max_sentences_per_document: int = 16  # a held-out document's first sentences, as queries


@dataclass
class InfoCSEConfig(TrainingConfig):
    # Before the one vocabulary the training settings sat under `training.` and the output
    # directory was `output_dir`.
    KEY_ALIASES: typing.ClassVar[dict[str, str]] = {"training.": "", "output_dir": "output.dir"}

    output: OutputConfig = field(default_factory=lambda: OutputConfig(dir="outputs/infocse"))
    documents: DocumentsConfig = field(default_factory=DocumentsConfig)
    annotation: AnnotationConfig = field(default_factory=AnnotationConfig)
    rounds: RoundsConfig = field(default_factory=RoundsConfig)
    supervised: SupervisedConfig = field(default_factory=SupervisedConfig)
    student: StudentConfig = field(default_factory=StudentConfig)
    heldout: HeldOutConfig = field(default_factory=HeldOutConfig)

    @property
    def training(self) -> TrainingConfig:
        """The settings each round's training starts from (shared: copy before changing)."""
        return training_sections(self)

    def validate(self) -> None:
        # Each section checks its own keys, naming them (ConfigError is a ValueError).
        self.documents.validate()
        self.annotation.validate()
        # Local paths must exist; 'org/name' and hf:// / s3:// / gs:// sources are read by the
        # readers from the hub or object store, so they cannot be checked here.
        require_sources(self.documents.paths, "documents.paths")
        super().validate()
        r, s = self.rounds, self.supervised
        require_range(r.max_rounds, "rounds.max_rounds", 1)
        require_range(r.patience, "rounds.patience", 1)
        require_range(r.min_improvement, "rounds.min_improvement", 0, 100, why="Spearman points")
        # STS-B / SICK gold scores run from 0 to 5: a threshold outside selects all or nothing.
        require_range(r.retrieval_threshold, "rounds.retrieval_threshold", 0, 5)
        _require(s.source in ("stsb", "sick"), "supervised.source", "must be 'stsb' or 'sick'")
        _require(
            not (r.overlap and s.enabled),
            "rounds.overlap",
            "cannot be used with supervised.enabled: InfoCSE++ annotates each round with the "
            "supervised model, which exists only after the round's training",
        )
        require_range(s.score_threshold, "supervised.score_threshold", 0, 5)
        require_range(s.max_steps, "supervised.max_steps", 1)
        require_range(s.learning_rate, "supervised.learning_rate", 0, low_open=True)
        require_range(self.student.num_layers, "student.num_layers", 1, allow_none=True)
        h = self.heldout
        require_range(h.fraction, "heldout.fraction", 0, 1, high_open=True,
                      why="a share of the documents; 1 leaves nothing to train on")  # fmt: skip
        require_seed(h.seed, "heldout.seed")
        require_range(h.max_sentences_per_document, "heldout.max_sentences_per_document", 2)
        _require(
            r.select_by != "heldout_dev_mrr" or h.fraction > 0,
            "rounds.select_by",
            "heldout_dev_mrr needs held-out documents: set heldout.fraction > 0, or choose "
            "rounds by stsb_dev",
        )
