"""The MCR² compression run's configuration (loaded with ``distributed_emb.config.load_config``).

Every setting of ``jobs/train_mcr2.py`` is declared here; ``--help`` lists them with their defaults.
"""

from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from distributed_emb.checks import ConfigError, require
from distributed_emb.data.beir_layout import BeirDataError, list_splits
from distributed_emb.data.held_out import SPLITS as HELD_OUT_SPLITS
from distributed_emb.data.held_out import HeldOutConfig
from distributed_emb.data.sources import require_sources
from distributed_emb.evaluation.transfer import TransferConfig
from distributed_emb.logging_config import LoggingConfig
from distributed_emb.losses.loss_config import COMPRESSION_DISTILL_WEIGHT, MCR2LossConfig
from distributed_emb.mcr2.data import PairsConfig, SentencesConfig
from distributed_emb.mcr2.embeddings import EncoderConfig
from distributed_emb.mcr2.matryoshka import MatryoshkaConfig
from distributed_emb.model.model_config import require_model_dir
from distributed_emb.ray_config import RayConfig, validate_ray_config
from distributed_emb.selection import (
    AUTO,
    STSB_DEV,
    TEST_SPLIT,
    check_select_by,
    documents_split,
    resolve_auto,
)
from distributed_emb.settings import Seed, section
from distributed_emb.storage_paths import require_writable

BASELINES = ("pca", "pca_whiten", "random", "full")  # the default list
# Opt-in: fine-tunes the encoder, then re-embeds every evaluation set (mcr2/matryoshka.py).
OPT_IN_BASELINES = ("matryoshka",)

# The names of model/compression_head.py ACTIVATIONS (a test checks they agree).
Activation = Literal["relu", "gelu", "tanh", "silu", "identity"]


@section
class HeadConfig:
    # [] is a linear head (one Dense): on MiniLM + the shipped data it beat [512] and [1024]
    # MLPs on STS-B dev at 64 and 128 dims (docs/MCR2.md, "Choosing the defaults").
    hidden_dims: Annotated[
        list[Annotated[int, Field(ge=1)]],
        Field(
            description="the widths of the head's hidden layers; []: a linear head (one Dense "
            "layer)"
        ),
    ] = field(default_factory=list)
    activation: Annotated[
        Activation, Field(description="the activation between the head's layers")
    ] = "gelu"
    dropout: Annotated[
        float,
        Field(ge=0, lt=1, description="dropout after each hidden activation (training only)"),
    ] = 0.0
    # pca makes epoch 0, which selection may keep, the PCA baseline exactly. pca with hidden
    # layers is refused in MCR2Config.validate().
    init: Annotated[
        Literal["auto", "pca", "random"],
        Field(
            description="where the head starts: pca (a linear head at the PCA map of the "
            "training vectors), random (PyTorch's init); auto: pca for a linear head, random "
            "for an MLP"
        ),
    ] = "auto"

    def starts_at_pca(self) -> bool:
        return self.init == "pca" or (self.init == "auto" and not self.hidden_dims)


@section
class AssignmentConfig:
    source: Annotated[
        Literal["column", "learned"],
        Field(
            description="the clusters Π of R_c: column (the sentences' id column: document id, "
            "IDC cluster, label) or learned (a linear + softmax head over num_clusters, "
            "trained with the compression head)"
        ),
    ] = "column"
    num_clusters: Annotated[
        int, Field(ge=2, description="learned: the number of soft clusters")
    ] = 32
    temperature: Annotated[
        float, Field(gt=0, description="learned: τ of the assignment softmax(W·z / τ)")
    ] = 1.0


@section
class HeadTrainingConfig:
    epochs: Annotated[
        int,
        Field(ge=1, description="passes over the training sentences (the best epoch is kept)"),
    ] = 30
    batch_size: Annotated[int, Field(ge=2, description="sentences per MCR² batch (rows of Z)")] = (
        512
    )
    pair_batch_size: Annotated[
        int, Field(ge=1, description="similar pairs per step for the pair term")
    ] = 256
    learning_rate: Annotated[float, Field(gt=0, description="AdamW learning rate")] = 1e-3
    weight_decay: Annotated[float, Field(ge=0, description="AdamW weight decay")] = 0.0
    seed: Annotated[
        Seed, Field(description="seed of the head's initialisation and batch order")
    ] = 0
    # 1 on a shared 2-core machine: the head's small matmuls gain little from 2, and OpenMP
    # barriers stall badly when cores are busy.
    torch_threads: Annotated[
        int, Field(ge=1, description="torch threads for head training in this process")
    ] = 1


@section
class CompressionEvalConfig:
    # Its dev sets select the best epoch (STS-B dev, and SICK-R dev where it holds SICK: their
    # mean) unless select_by names a retrieval split.
    senteval_dir: Annotated[
        str | None,
        Field(
            description="a SentEval data/downstream directory: its dev sets select the best "
            "epoch, and every STS, transfer and retrieval task in it is reported; null: the "
            "shipped STS-B only"
        ),
    ] = None
    extra_senteval_dirs: Annotated[
        list[str],
        Field(
            description="more data/downstream directories to evaluate on (e.g. one holding "
            "STS12-16): each task is read from the first directory, senteval_dir first, that "
            "holds it; selection stays on senteval_dir"
        ),
    ] = field(default_factory=list)
    tasks: Annotated[
        list[Literal["sts", "transfer", "retrieval"]],
        Field(description="the task groups evaluated for every method and size"),
    ] = field(default_factory=lambda: ["sts", "transfer", "retrieval"])
    # STS-B gold scores run from 0 to 5: a bound outside selects nothing or everything.
    retrieval_min_score: Annotated[
        float,
        Field(
            ge=0,
            le=5,
            description="STS-B test pairs scored at least this are the retrieval queries and "
            "positives, searched among all of them",
        ),
    ] = 4.0
    # The shipped news set by default: in-domain for the Lee news sentences the heads train on.
    # Its 9,782 texts and 589 queries are embedded once by the frozen encoder for every method
    # (each head or baseline is a matmul of the cached vectors). Reported; selected on only
    # when select_by names one of its splits.
    retrieval_dir: Annotated[
        str | None,
        Field(
            description="a BEIR directory (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) or "
            "shipped:news, scored for every method and size: each split's nDCG@10 in the "
            "table, with its paired interval against the uncompressed encoder and each head's "
            "against PCA (an epoch is selected on it only when eval.select_by names a split); "
            "null: none"
        ),
    ] = "shipped:news"
    retrieval_splits: Annotated[
        list[str] | None,
        Field(
            description="the splits (qrels/<split>.tsv) of eval.retrieval_dir to score; null: "
            "every split there"
        ),
    ] = None
    # The other training jobs' key and vocabulary (selection.py); stsb_dev is this job's own
    # dev choice, the mean over its dev sets. Checked (auto resolved) in validate_retrieval.
    # stsb_dev stays the default: auto would choose on the shipped news set's dev split (the
    # default eval.retrieval_dir), a change of the measured default not re-measured yet.
    select_by: Annotated[
        str,
        Field(
            description="what chooses each head's epoch: stsb_dev (the STS dev mean: STS-B "
            "dev, and SICK-R dev where eval.senteval_dir holds SICK; named as in the other "
            "training jobs), retrieval:<split> (nDCG@10 on that split of eval.retrieval_dir, "
            "e.g. retrieval:dev) or documents:dev (nDCG@10 on the dev split of the run's "
            "held-out documents, heldout.*); never test. auto: retrieval:dev when "
            "eval.retrieval_dir has a dev split, else documents:dev when documents are held "
            "out, else stsb_dev"
        ),
    ] = STSB_DEV
    # Passages are several sentences: cut at model.max_seq_length they would be scored on
    # their first ones. evaluation/yardsticks.py passage_length reads it, as the training
    # job's eval.documents_max_seq_length.
    documents_max_seq_length: Annotated[
        int,
        Field(
            ge=8,
            description="tokens a passage of the held-out documents' yardstick is embedded "
            "with by the frozen encoder (at most its position limit)",
        ),
    ] = 256
    # 5 folds (SimCSE's "fasttest") instead of SentEval's 10, because every method is
    # evaluated: the nested cross-validation is ~600 fits per task and method.
    transfer: TransferConfig = field(default_factory=lambda: TransferConfig(kfold=5))


@section
class CompressionOutputConfig:
    dir: Annotated[
        str,
        Field(description="where results.json / .md, the exported models and run.log go"),
    ] = "outputs/mcr2"
    storage_path: Annotated[
        str | None,
        Field(
            description="s3://, gs:// or a shared path: the run's logs and curves go to "
            "<storage_path>/<run_name>/logs/ while it runs, and every file of output.dir to "
            "<storage_path>/<run_name>/ when it ends; null: output.dir only"
        ),
    ] = None
    run_name: Annotated[
        str | None,
        Field(description="the run's directory under output.storage_path; null: output.dir's name"),
    ] = None


@section
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

    # At least one, no duplicates: validate().
    output_dims: Annotated[
        list[Annotated[int, Field(ge=1)]],
        Field(description="the compressed sizes: one head (and export) per size"),
    ] = field(default_factory=lambda: [64, 128])
    output: CompressionOutputConfig = field(default_factory=CompressionOutputConfig)
    baselines: Annotated[
        list[Literal["pca", "pca_whiten", "random", "full", "matryoshka"]],
        Field(
            description="the methods compared with the heads in the same run (matryoshka, "
            "opt-in, fine-tunes the encoder)"
        ),
    ] = field(default_factory=lambda: list(BASELINES))
    export: Annotated[
        bool,
        Field(
            description="write the encoder + best head as a SentenceTransformer directory per size"
        ),
    ] = True
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
    # The documents held out of the heads' training data by the hash every method uses
    # (data/held_out.py): the run's document-level yardstick (documents_eval/ in output.dir).
    heldout: HeldOutConfig = field(default_factory=HeldOutConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    # train_log.jsonl and TensorBoard/W&B/MLflow in output.dir (each head's epochs, the table);
    # logging_steps: a console line every N epochs of a head.
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def validate(self) -> None:
        """What the declarations cannot say: checks of more than one setting, of a list as a
        whole, and of the disk."""
        require(bool(self.output_dims), "output_dims", "give at least one output size")
        require(
            len(set(self.output_dims)) == len(self.output_dims), "output_dims", "has duplicates"
        )
        require(bool(self.output.dir.strip()), "output.dir", "is empty")
        require_writable(self.output.storage_path, "output.storage_path")
        e = self.model
        require_model_dir(e.path, "model.path")
        s, p = self.sentences, self.pairs
        if s.paths:
            require_sources(s.paths, "sentences.paths")
        if p.source == "file" and p.path:
            require_sources([p.path], "pairs.path")
        if p.source == "sts" and p.senteval_dir is not None:
            require(
                Path(p.senteval_dir).is_dir(),
                "pairs.senteval_dir",
                f"{p.senteval_dir} is not a directory",
            )
        p.validate()
        lo = self.loss
        weights = (lo.expand_weight, lo.compress_weight, lo.pair_weight, lo.distill_weight)
        require(
            any(w > 0 for w in weights),
            "loss",
            "every term is off (expand_weight, compress_weight, pair_weight and distill_weight "
            "are 0): the head would not train",
        )
        h = self.head
        require(
            h.init != "pca" or not h.hidden_dims,
            "head.init",
            "pca starts a linear head; with head.hidden_dims set use auto or random",
        )
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
        validate_retrieval(ev, self.builds_documents())
        ev.transfer.validate("eval.transfer")
        m = self.matryoshka
        if "matryoshka" in self.baselines and m.positives == "pairs":
            require(self.pairs.source != "none", "matryoshka.positives", "pairs needs pairs")
        validate_ray_config(self.ray)

    def builds_documents(self) -> bool:
        """Does the run hold documents out, and so build its document-level yardstick?"""
        return self.heldout.fraction > 0


# What check_select_by names as the documents' directory: the run writes it.
HELD_OUT_DOCUMENTS = "the run's held-out documents"


def validate_retrieval(ev: CompressionEvalConfig, builds_documents: bool = False) -> None:
    """eval.retrieval_dir is a BEIR directory (or a shipped set) with qrels, each of
    eval.retrieval_splits is one of its splits, and eval.select_by (auto resolved in place,
    selection.resolve_auto) names stsb_dev, one of them or documents:dev (not test; needs
    `builds_documents`: held-out documents, heldout.fraction > 0)."""
    splits = ev.retrieval_splits
    present = None
    if ev.retrieval_dir is None:
        require(splits is None, "eval.retrieval_splits", "given without eval.retrieval_dir")
    else:
        try:
            present = list_splits(ev.retrieval_dir)
        except BeirDataError as error:
            raise ConfigError(f"eval.retrieval_dir: {error}") from None
        require(
            bool(present), "eval.retrieval_dir", f"{ev.retrieval_dir}/qrels holds no <split>.tsv"
        )
    if ev.select_by == AUTO:
        ev.select_by = resolve_auto(AUTO, present, builds_documents)
    chosen = documents_split(ev.select_by)
    require(
        builds_documents or not chosen or chosen == TEST_SPLIT,
        "eval.select_by",
        f"{ev.select_by} needs held-out documents (heldout.fraction > 0; it is 0)",
    )
    check_select_by(
        ev.select_by,
        ev.retrieval_dir,
        present,
        documents_dir=HELD_OUT_DOCUMENTS if builds_documents else None,
        documents_splits=list(HELD_OUT_SPLITS),
    )
    if splits is None:
        return
    require(bool(splits), "eval.retrieval_splits", "is empty; give a split or null (every split)")
    for i, split in enumerate(splits):
        require(
            split in present,
            f"eval.retrieval_splits[{i}]",
            f"{ev.retrieval_dir}/qrels has no {split}.tsv; its splits: {', '.join(present)}",
        )
