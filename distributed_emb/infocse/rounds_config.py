"""InfoCSE run configuration: the training settings every round trains with (model, data, loss,
train, eval, output, ray, logging, export: the same keys as the training job), plus documents,
annotation, the stopping rule and optional InfoCSE++ supervised rounds. Loaded with
`distributed_emb.config.load_config`."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import field
from typing import Annotated, Literal

from pydantic import Field

from distributed_emb.checks import require as _require
from distributed_emb.config import TrainingConfig, training_sections
from distributed_emb.data.documents import DocumentsConfig, no_documents
from distributed_emb.data.sources import require_sources
from distributed_emb.infocse.annotate import AnnotationConfig
from distributed_emb.settings import section
from distributed_emb.train.output_config import OutputConfig


@section
class RoundsConfig:
    max_rounds: Annotated[int, Field(ge=1, description="annotate-and-train rounds at most")] = 3
    # 2: one short round is a noisy signal; the second re-annotates with the first round's
    # model before giving up.
    patience: Annotated[
        int,
        Field(ge=1, description="rounds without a new best dev score before stopping"),
    ] = 2
    min_improvement: Annotated[
        float,
        Field(
            ge=0,
            le=100,
            description="points (Spearman or MRR, 0-100) a round's dev score must gain over "
            "the best so far to count as better",
        ),
    ] = 0.0
    # STS-B gold scores run from 0 to 5: a threshold outside selects all or nothing.
    retrieval_threshold: Annotated[
        float,
        Field(
            ge=0,
            le=5,
            description="STS-B dev pairs scored at least this form the retrieval dev set",
        ),
    ] = 4.0
    stsb_test: Annotated[
        bool,
        Field(
            description="also score every round's model on STS-B test (reported only; never "
            "used to choose)"
        ),
    ] = False
    # The held-out test half and STS-B are reported beside it, never used to choose. "eval":
    # the rounds choose on what each round's training chooses its checkpoint on.
    select_by: Annotated[
        Literal["stsb_dev", "heldout_dev_mrr", "eval"],
        Field(
            description="the dev score that chooses the exported round and stops the rounds: "
            "STS-B dev Spearman; same-document retrieval MRR on the dev half of the held-out "
            "documents (the in-domain metric InfoCSE is for; needs heldout.fraction > 0); or "
            "eval: whatever eval.select_by says (STS-B dev, or nDCG@10 on a split of "
            "eval.retrieval_dir, the user's own dev set), the score each round's training "
            "keeps its checkpoint by"
        ),
    ] = "stsb_dev"
    # infocse/overlap.py. Not with InfoCSE++: its rounds annotate with the supervised model.
    overlap: Annotated[
        bool,
        Field(
            description="mine the next round's pairs while this round trains, with its best "
            "checkpoint so far; the next round uses the pairs of the checkpoint it keeps, "
            "else the freshest ones"
        ),
    ] = False


@section
class SupervisedConfig:
    """InfoCSE++: after each unsupervised round, fine-tune on labelled pairs."""

    enabled: Annotated[
        bool,
        Field(description="InfoCSE++: fine-tune on labelled pairs after each unsupervised round"),
    ] = False
    source: Annotated[
        Literal["stsb", "sick"],
        Field(
            description="the labelled pairs: the STS-B or SICK train split, from eval.senteval_dir"
        ),
    ] = "stsb"
    # STS-B / SICK gold scores run from 0 to 5.
    score_threshold: Annotated[
        float,
        Field(ge=0, le=5, description="pairs with a gold score at least this are positives"),
    ] = 4.0
    max_steps: Annotated[
        int, Field(ge=1, description="optimizer steps of each supervised fine-tuning")
    ] = 50
    learning_rate: Annotated[
        float, Field(gt=0, description="peak learning rate of the supervised fine-tuning")
    ] = 1.0e-5


@section
class StudentConfig:
    """The trained model (the student): `model.path` itself, or its first `num_layers`
    transformer layers (infocse/student.py), built offline into the rounds' `student/`."""

    num_layers: Annotated[
        int | None,
        Field(
            ge=1,
            description="train the first N transformer layers of model.path (built offline "
            "into the rounds' student/); null: train model.path itself",
        ),
    ] = None


@section
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

    @property
    def training(self) -> TrainingConfig:
        """The settings each round's training starts from (shared: copy before changing). Its
        documents are the rounds' mined pairs, not documents.paths: a round never prepares
        the documents as a training run on documents does."""
        return dataclasses.replace(training_sections(self), documents=no_documents())

    def validate(self) -> None:
        """The checks that read more than one setting, or the disk (the ranges are declared)."""
        self.documents.validate()
        # Local paths must exist; 'org/name' and hf:// / s3:// / gs:// sources are read by the
        # readers from the hub or object store, so they cannot be checked here.
        require_sources(self.documents.paths, "documents.paths")
        super().validate()
        r, s, h = self.rounds, self.supervised, self.heldout
        _require(
            not (r.overlap and s.enabled),
            "rounds.overlap",
            "cannot be used with supervised.enabled: InfoCSE++ annotates each round with the "
            "supervised model, which exists only after the round's training",
        )
        _require(
            r.select_by != "heldout_dev_mrr" or h.fraction > 0,
            "rounds.select_by",
            "heldout_dev_mrr needs held-out documents: set heldout.fraction > 0, or choose "
            "rounds by stsb_dev",
        )
        _require(
            not (r.select_by == "eval" and self.eval.select_by.startswith("documents:"))
            or h.fraction > 0,
            "eval.select_by",
            f"{self.eval.select_by} needs held-out documents: set heldout.fraction > 0, or "
            "choose by stsb_dev",
        )
