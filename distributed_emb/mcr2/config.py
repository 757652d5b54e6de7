"""The MCR² compression run's configuration (loaded with ``distributed_emb.config.load_config``).

Every knob of ``jobs/train_mcr2.py`` lives here; ``jobs/configs/mcr2.yaml`` shows them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from distributed_emb.config import ConfigError, RayConfig
from distributed_emb.evaluation.transfer import TransferConfig
from distributed_emb.losses.mcr2 import MCR2LossConfig
from distributed_emb.mcr2.data import PairsConfig, SentencesConfig
from distributed_emb.mcr2.embeddings import EncoderConfig
from distributed_emb.mcr2.head import ACTIVATIONS

BASELINES = ("pca", "random", "full")


@dataclass
class HeadConfig:
    # [] is a linear head (one Dense): on MiniLM + the shipped data it beat [512] and [1024]
    # MLPs on STS-B dev at 64 and 128 dims (docs/MCR2.md, "Choosing the defaults").
    hidden_dims: list[int] = field(default_factory=list)
    activation: str = "gelu"
    dropout: float = 0.0


@dataclass
class AssignmentConfig:
    # column: Π from the sentences' id column (document id, IDC cluster, label);
    # learned: a linear + softmax head over `num_clusters`, trained with the compression head.
    source: Literal["column", "learned"] = "column"
    num_clusters: int = 32
    temperature: float = 1.0


@dataclass
class OptimConfig:
    epochs: int = 30
    batch_size: int = 512  # sentences per MCR² batch (rows of Z)
    pair_batch_size: int = 256  # similar pairs per step for the pair term
    lr: float = 1e-3
    weight_decay: float = 0.0
    seed: int = 0
    # Threads for head training in this process. 1 on a shared 2-core machine: the head's
    # small matmuls gain little from 2, and OpenMP barriers stall badly when cores are busy.
    torch_threads: int = 1


@dataclass
class EvalConfig:
    # A SentEval data/downstream dir (None: the shipped STS-B only). STS-B dev there selects
    # the best epoch; every STS, transfer and retrieval task present in it is reported.
    senteval_dir: str | None = None
    tasks: list[Literal["sts", "transfer", "retrieval"]] = field(
        default_factory=lambda: ["sts", "transfer", "retrieval"]
    )
    # Retrieval queries/positives: STS-B test pairs scored ≥ this, searched among all of them.
    retrieval_min_score: float = 4.0
    # SentEval's transfer protocol; 5 folds (SimCSE's "fasttest") instead of 10, because every
    # method is evaluated: the nested cross-validation is ~600 fits per task and method.
    transfer: TransferConfig = field(default_factory=lambda: TransferConfig(kfold=5))


@dataclass
class MCR2Config:
    output_dims: list[int] = field(default_factory=lambda: [64, 128])
    output_dir: str = "outputs/mcr2"
    baselines: list[Literal["pca", "random", "full"]] = field(
        default_factory=lambda: list(BASELINES)
    )
    export: bool = True  # write encoder + best head as a SentenceTransformer dir per dim
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    sentences: SentencesConfig = field(default_factory=SentencesConfig)
    pairs: PairsConfig = field(default_factory=PairsConfig)
    assignments: AssignmentConfig = field(default_factory=AssignmentConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    loss: MCR2LossConfig = field(default_factory=MCR2LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def validate(self) -> None:
        def require(condition: bool, key: str, message: str) -> None:
            if not condition:
                raise ConfigError(f"{key}: {message}")

        require(bool(self.output_dims), "output_dims", "give at least one output size")
        require(all(d >= 1 for d in self.output_dims), "output_dims", "sizes must be ≥ 1")
        require(
            len(set(self.output_dims)) == len(self.output_dims), "output_dims", "has duplicates"
        )
        require(
            self.head.activation in ACTIVATIONS, "head.activation", f"one of {list(ACTIVATIONS)}"
        )
        require(all(h >= 1 for h in self.head.hidden_dims), "head.hidden_dims", "sizes must be ≥ 1")
        require(0.0 <= self.head.dropout < 1.0, "head.dropout", "must be in [0, 1)")
        require(self.loss.eps > 0, "loss.eps", "must be > 0")
        require(self.assignments.num_clusters >= 2, "assignments.num_clusters", "must be ≥ 2")
        require(self.assignments.temperature > 0, "assignments.temperature", "must be > 0")
        require(self.optim.epochs >= 1, "optim.epochs", "must be ≥ 1")
        require(self.optim.batch_size >= 2, "optim.batch_size", "must be ≥ 2")
        require(self.optim.pair_batch_size >= 1, "optim.pair_batch_size", "must be ≥ 1")
        require(self.optim.lr > 0, "optim.lr", "must be > 0")
        require(self.optim.torch_threads >= 1, "optim.torch_threads", "must be ≥ 1")
        require(self.encoder.batch_size >= 1, "encoder.batch_size", "must be ≥ 1")
        require(self.encoder.concurrency >= 1, "encoder.concurrency", "must be ≥ 1")
        for section, check in (("sentences", self.sentences), ("pairs", self.pairs)):
            try:
                check.validate()
            except ValueError as error:
                message = str(error)
                raise ConfigError(
                    message if message.startswith(section) else f"{section}: {message}"
                ) from error
