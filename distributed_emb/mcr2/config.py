"""The MCR² compression run's configuration (loaded with ``distributed_emb.config.load_config``).

Every setting of ``jobs/train_mcr2.py`` is declared here; ``--help`` lists them with their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from distributed_emb.config import (
    ConfigError,
    LoggingConfig,
    RayConfig,
    require_model_dir,
    require_range,
    require_seed,
    require_sources,
    validate_logging_config,
    validate_mcr2_loss,
    validate_ray_config,
)
from distributed_emb.evaluation.transfer import TransferConfig
from distributed_emb.losses.mcr2 import COMPRESSION_DISTILL_WEIGHT, MCR2LossConfig
from distributed_emb.mcr2.data import PairsConfig, SentencesConfig
from distributed_emb.mcr2.embeddings import EncoderConfig
from distributed_emb.mcr2.matryoshka import MatryoshkaConfig
from distributed_emb.model.compression_head import ACTIVATIONS

BASELINES = ("pca", "pca_whiten", "random", "full")  # the default list
# Opt-in: fine-tunes the encoder, then re-embeds every evaluation set (mcr2/matryoshka.py).
OPT_IN_BASELINES = ("matryoshka",)


@dataclass
class HeadConfig:
    # [] is a linear head (one Dense): on MiniLM + the shipped data it beat [512] and [1024]
    # MLPs on STS-B dev at 64 and 128 dims (docs/MCR2.md, "Choosing the defaults").
    hidden_dims: list[int] = field(default_factory=list)
    activation: str = "gelu"
    dropout: float = 0.0
    # Where the head starts: pca (a linear head at the PCA map of the training vectors, so
    # epoch 0, which selection may keep, is the PCA baseline), random (PyTorch's init), or
    # auto: pca for a linear head, random for an MLP.
    init: Literal["auto", "pca", "random"] = "auto"

    def starts_at_pca(self) -> bool:
        return self.init == "pca" or (self.init == "auto" and not self.hidden_dims)


@dataclass
class AssignmentConfig:
    # column: Π from the sentences' id column (document id, IDC cluster, label);
    # learned: a linear + softmax head over `num_clusters`, trained with the compression head.
    source: Literal["column", "learned"] = "column"
    num_clusters: int = 32
    temperature: float = 1.0


@dataclass
class HeadTrainingConfig:
    epochs: int = 30
    batch_size: int = 512  # sentences per MCR² batch (rows of Z)
    pair_batch_size: int = 256  # similar pairs per step for the pair term
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    seed: int = 0
    # Threads for head training in this process. 1 on a shared 2-core machine: the head's
    # small matmuls gain little from 2, and OpenMP barriers stall badly when cores are busy.
    torch_threads: int = 1


@dataclass
class CompressionEvalConfig:
    # A SentEval data/downstream dir (None: the shipped STS-B only). Its dev sets select the
    # best epoch (STS-B dev, and SICK-R dev where it holds SICK: their mean); every STS,
    # transfer and retrieval task present in it is reported.
    senteval_dir: str | None = None
    # More data/downstream dirs to evaluate on (e.g. one holding STS12–16): each task is read
    # from the first dir, senteval_dir first, that holds it. Selection stays on senteval_dir.
    extra_senteval_dirs: list[str] = field(default_factory=list)
    tasks: list[Literal["sts", "transfer", "retrieval"]] = field(
        default_factory=lambda: ["sts", "transfer", "retrieval"]
    )
    # Retrieval queries/positives: STS-B test pairs scored ≥ this, searched among all of them.
    retrieval_min_score: float = 4.0
    # SentEval's transfer protocol; 5 folds (SimCSE's "fasttest") instead of 10, because every
    # method is evaluated: the nested cross-validation is ~600 fits per task and method.
    transfer: TransferConfig = field(default_factory=lambda: TransferConfig(kfold=5))


@dataclass
class CompressionOutputConfig:
    dir: str = "outputs/mcr2"  # results.json / .md, the exported models, run.log


@dataclass
class MCR2Config:
    # Before the one vocabulary: the encoder was `encoder.`, head training `optim.` (its rate
    # `optim.lr`), the output directory `output_dir`.
    KEY_ALIASES: ClassVar[dict[str, str]] = {
        "encoder.": "model.",
        "optim.lr": "train.learning_rate",
        "optim.": "train.",
        "output_dir": "output.dir",
        "matryoshka.lr": "matryoshka.learning_rate",
    }

    output_dims: list[int] = field(default_factory=lambda: [64, 128])
    output: CompressionOutputConfig = field(default_factory=CompressionOutputConfig)
    baselines: list[Literal["pca", "pca_whiten", "random", "full", "matryoshka"]] = field(
        default_factory=lambda: list(BASELINES)
    )
    export: bool = True  # write encoder + best head as a SentenceTransformer dir per dim
    model: EncoderConfig = field(default_factory=EncoderConfig)  # the frozen encoder
    sentences: SentencesConfig = field(default_factory=SentencesConfig)
    pairs: PairsConfig = field(default_factory=PairsConfig)
    assignments: AssignmentConfig = field(default_factory=AssignmentConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    # The head keeps the encoder's in-batch neighbours (distill_weight): without that term
    # the MCR² head lost to PCA on every STS set it never saw (docs/MCR2.md).
    loss: MCR2LossConfig = field(
        default_factory=lambda: MCR2LossConfig(distill_weight=COMPRESSION_DISTILL_WEIGHT)
    )
    train: HeadTrainingConfig = field(default_factory=HeadTrainingConfig)
    eval: CompressionEvalConfig = field(default_factory=CompressionEvalConfig)
    matryoshka: MatryoshkaConfig = field(default_factory=MatryoshkaConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    # train_log.jsonl and TensorBoard/W&B/MLflow in output.dir (each head's epochs, the table);
    # logging_steps: a console line every N epochs of a head.
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def validate(self) -> None:
        def require(condition: bool, key: str, message: str) -> None:
            if not condition:
                raise ConfigError(f"{key}: {message}")

        require(bool(self.output_dims), "output_dims", "give at least one output size")
        for i, dim in enumerate(self.output_dims):
            require_range(dim, f"output_dims[{i}]", 1)
        require(
            len(set(self.output_dims)) == len(self.output_dims), "output_dims", "has duplicates"
        )
        require(bool(self.output.dir.strip()), "output.dir", "is empty")
        e = self.model
        require_model_dir(e.path, "model.path")
        require_range(e.max_seq_length, "model.max_seq_length", 4, allow_none=True)
        require_range(e.batch_size, "model.batch_size", 1)
        require_range(e.concurrency, "model.concurrency", 1)
        require_range(e.torch_threads, "model.torch_threads", 1, allow_none=True)
        s, p = self.sentences, self.pairs
        if s.paths:
            require_sources(s.paths, "sentences.paths")
        require_range(s.min_sentences, "sentences.min_sentences", 1)
        require_seed(s.seed, "sentences.seed")
        if p.source == "file" and p.path:
            require_sources([p.path], "pairs.path")
        if p.source == "sts" and p.senteval_dir is not None:
            require(
                Path(p.senteval_dir).is_dir(),
                "pairs.senteval_dir",
                f"{p.senteval_dir} is not a directory",
            )
        # STS-B and SICK gold scores run from 0 to 5: a bound outside selects nothing or all.
        require_range(p.min_score, "pairs.min_score", 0, 5)
        require_seed(p.seed, "pairs.seed")

        a = self.assignments
        require_range(a.num_clusters, "assignments.num_clusters", 2)
        require_range(a.temperature, "assignments.temperature", 0, low_open=True)
        h = self.head
        require(
            self.head.activation in ACTIVATIONS, "head.activation", f"one of {list(ACTIVATIONS)}"
        )
        for i, hidden in enumerate(h.hidden_dims):
            require_range(hidden, f"head.hidden_dims[{i}]", 1)
        require_range(h.dropout, "head.dropout", 0, 1, high_open=True)
        require(
            h.init in ("auto", "pca", "random"), "head.init", f"auto, pca or random, not {h.init!r}"
        )
        require(
            h.init != "pca" or not h.hidden_dims,
            "head.init",
            "pca starts a linear head; with head.hidden_dims set use auto or random",
        )
        validate_mcr2_loss(self.loss, "loss")
        o = self.train
        require_range(o.epochs, "train.epochs", 1)
        require_range(o.batch_size, "train.batch_size", 2)
        require_range(o.pair_batch_size, "train.pair_batch_size", 1)
        require_range(o.learning_rate, "train.learning_rate", 0, low_open=True)
        require_range(o.weight_decay, "train.weight_decay", 0)
        require_seed(o.seed, "train.seed")
        require_range(o.torch_threads, "train.torch_threads", 1)
        ev = self.eval
        if ev.senteval_dir is not None:
            require(
                Path(ev.senteval_dir).is_dir(),
                "eval.senteval_dir",
                f"{ev.senteval_dir} is not a directory",
            )
        for i, directory in enumerate(ev.extra_senteval_dirs):
            require(
                Path(directory).is_dir(),
                f"eval.extra_senteval_dirs[{i}]",
                f"{directory} is not a directory",
            )
        require_range(ev.retrieval_min_score, "eval.retrieval_min_score", 0, 5)
        tr = ev.transfer
        require_range(tr.kfold, "eval.transfer.kfold", 2)
        require_seed(tr.seed, "eval.transfer.seed")
        require_range(tr.max_iter, "eval.transfer.max_iter", 1)
        for name in ("inner_kfold_c", "kfold_c"):
            grid = getattr(tr, name)
            require(bool(grid), f"eval.transfer.{name}", "give at least one C")
            for i, c in enumerate(grid):
                require_range(c, f"eval.transfer.{name}[{i}]", 0, low_open=True)
        m = self.matryoshka
        require_range(m.steps, "matryoshka.steps", 1)
        require_range(m.batch_size, "matryoshka.batch_size", 2)
        require_range(m.learning_rate, "matryoshka.learning_rate", 0, low_open=True)
        require_seed(m.seed, "matryoshka.seed")
        if "matryoshka" in self.baselines and m.positives == "pairs":
            require(self.pairs.source != "none", "matryoshka.positives", "pairs needs pairs")
        validate_ray_config(self.ray)
        validate_logging_config(self.logging)
        for section, check in (("sentences", self.sentences), ("pairs", self.pairs)):
            try:
                check.validate()
            except ValueError as error:
                message = str(error)
                raise ConfigError(
                    message if message.startswith(section) else f"{section}: {message}"
                ) from error
