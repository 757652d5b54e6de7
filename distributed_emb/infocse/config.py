"""InfoCSE run configuration: documents, annotation, the per-round training, the stopping rule
and optional InfoCSE++ supervised rounds. Loaded with `distributed_emb.config.load_config`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from distributed_emb.config import ConfigError, TrainingConfig, _require
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


@dataclass
class SupervisedConfig:
    """InfoCSE++: after each unsupervised round, fine-tune on labelled pairs."""

    enabled: bool = False
    source: str = "stsb"  # "stsb" or "sick" train split, from eval.senteval_dir
    score_threshold: float = 4.0  # pairs with gold score ≥ this are positives
    max_steps: int = 50
    learning_rate: float = 1.0e-5


@dataclass
class InfoCSEConfig:
    documents: DocumentsConfig = field(default_factory=DocumentsConfig)
    annotation: AnnotationConfig = field(default_factory=AnnotationConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    rounds: RoundsConfig = field(default_factory=RoundsConfig)
    supervised: SupervisedConfig = field(default_factory=SupervisedConfig)
    output_dir: str = "outputs/infocse"

    def validate(self) -> None:
        for name, section in (("documents", self.documents), ("annotation", self.annotation)):
            try:
                section.validate()
            except ValueError as error:
                raise ConfigError(f"{name}: {error}") from error
        for path in self.documents.paths:
            _require(
                Path(path).exists() or self.documents.format == "hf",
                "documents.paths",
                f"{path} does not exist",
            )
        try:
            self.training.validate()
        except ConfigError as error:
            raise ConfigError(f"training.{error}") from error
        r, s = self.rounds, self.supervised
        _require(r.max_rounds >= 1, "rounds.max_rounds", "must be >= 1")
        _require(r.patience >= 1, "rounds.patience", "must be >= 1")
        _require(s.source in ("stsb", "sick"), "supervised.source", "must be 'stsb' or 'sick'")
        _require(s.max_steps >= 1, "supervised.max_steps", "must be >= 1")
        _require(s.learning_rate > 0, "supervised.learning_rate", "must be > 0")
