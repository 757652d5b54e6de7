"""Train one MCR² compression head on cached encoder vectors; keep the best epoch on the dev
sets (STS-B dev, and SICK-R dev where the SentEval data has it: their mean Spearman), or, with
eval.select_by=retrieval:<split> or documents:dev, on nDCG@10 of that retrieval split or of
the held-out documents' dev split (evaluation/beir.py's search and metrics over the head's
projection of the split's cached vectors: one path for both).

Everything here is vectors in, vectors out: the frozen encoder ran once beforehand
(``mcr2/embeddings.py``), so an epoch over a few thousand sentences takes well under a second
on a laptop CPU and several output sizes train one after another in minutes.

One step: a batch of sentences X (B×D) with cluster ids (or learned Π), and a batch of similar
pairs (A, P), each (m×D); loss = −R(head(X)) + R_c(head(X), Π) − λ·mean cos(head(A), head(P))
+ μ·KL(P_X ‖ P_head(X)), the last keeping each sentence's in-batch neighbours the encoder's.
A linear head starts at the PCA map of the training vectors by default (``head.init``).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from distributed_emb.evaluation.beir import RetrievalSplit, retrieval_metrics, search
from distributed_emb.evaluation.sts import spearman_of_embeddings
from distributed_emb.losses.mcr2 import MCR2Loss, MCR2LossConfig
from distributed_emb.mcr2.assignments import SoftAssignmentHead
from distributed_emb.mcr2.baselines import fit_pca_model
from distributed_emb.mcr2.compression_config import AssignmentConfig, HeadConfig, HeadTrainingConfig
from distributed_emb.model.compression_head import CompressionHead
from distributed_emb.selection import SELECT_METRIC, retrieval_metric

log = logging.getLogger(__name__)


@dataclass
class RetrievalDevSet:
    """The retrieval split that chooses each head's epoch (eval.select_by=retrieval:<split>,
    or documents:dev: the held-out documents' yardstick, its passages embedded at the
    passage length), its texts embedded once by the frozen encoder: an epoch is then a matmul
    and a search."""

    split: RetrievalSplit  # the corpus, the split's queries and their qrels
    vectors: np.ndarray  # (q + c, D) frozen-encoder vectors of query_texts, then corpus_texts
    # The history key of its score, as the table's (selection.selected_metric):
    # retrieval_<split>_ndcg_at_10, or documents_<split>_ndcg_at_10; "": the former.
    metric: str = ""
    # search() hands texts to its encode function: each text's row in `vectors` (a text that is
    # both a query and a document has one vector, the frozen encoder being deterministic).
    rows: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        texts = [*self.split.query_texts, *self.split.corpus_texts]
        if self.vectors.shape[0] != len(texts):
            raise ValueError(f"{self.vectors.shape[0]} vectors for {len(texts)} texts")
        self.vectors = np.ascontiguousarray(self.vectors, dtype=np.float32)
        self.rows = {text: row for row, text in enumerate(texts)}
        self.metric = self.metric or retrieval_metric(self.split.name)


@dataclass
class HeadTrainingData:
    sentences: np.ndarray  # (n, D) frozen-encoder vectors of the training sentences
    cluster_ids: np.ndarray | None  # (n,) int64, or None when Π is learned
    pairs: tuple[np.ndarray, np.ndarray] | None  # ((m, D), (m, D)) similar pairs, or None
    # STS dev sets by name ("stsb_dev", "sickr_dev"): (p, D), (p, D), (p,) gold scores each.
    # The mean of their Spearmans ("dev_avg") picks the epoch unless `retrieval` is given.
    dev: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    # eval.select_by=retrieval:<split> or documents:dev: that split's nDCG@10 picks the epoch
    # instead.
    retrieval: RetrievalDevSet | None = None

    def select_key(self) -> str:
        """The history key whose highest value chooses the epoch."""
        return "dev_avg" if self.retrieval is None else self.retrieval.metric


@dataclass
class TrainedHead:
    head: CompressionHead  # the best epoch's weights, in eval mode
    assignment_head: SoftAssignmentHead | None
    best_epoch: int  # 0 = the untrained head
    # That epoch's Spearman × 100 per dev set and their "dev_avg", and its retrieval nDCG@10
    # when a retrieval split chose.
    best_dev: dict[str, float]
    best_score: float = float("nan")  # that epoch's score that chose (select_score)
    history: list[dict] = field(default_factory=list)  # one row of metrics per epoch
    seconds: float = 0.0


def dev_scores(
    embed: Callable[[str, int], np.ndarray], gold: dict[str, np.ndarray]
) -> dict[str, float]:
    """Spearman × 100 on each dev set (the project's one STS implementation) and their mean,
    ``dev_avg``: the selection score of heads and the table. `gold` holds each set's gold
    scores by name; `embed(name, side)` gives the method's vectors of that set's first
    (side 0) or second (1) sentences."""
    scores = {
        name: spearman_of_embeddings(embed(name, 0), embed(name, 1), scores)
        for name, scores in gold.items()
    }
    scores["dev_avg"] = float(np.mean(list(scores.values())))
    return scores


def head_dev_scores(head: CompressionHead, dev: dict[str, tuple[np.ndarray, ...]]) -> dict:
    """`dev_scores` of the head's vectors of the dev sets' encoder vectors."""
    was_training = head.training
    head.eval()
    with torch.no_grad():
        scores = dev_scores(
            lambda name, side: head(torch.from_numpy(dev[name][side])).numpy(),
            {name: gold for name, (_, _, gold) in dev.items()},
        )
    head.train(was_training)
    return scores


def head_retrieval_score(head: CompressionHead, retrieval: RetrievalDevSet) -> float:
    """nDCG@10 × 100 of the head's vectors on the retrieval split: the frozen encoder's cached
    vectors projected once, then the project's one search and one scorer (evaluation/beir.py),
    the ones the table's retrieval columns come from."""
    was_training = head.training
    head.eval()
    with torch.no_grad():
        projected = head(torch.from_numpy(retrieval.vectors)).numpy()  # (q + c, d)
    head.train(was_training)
    run = search(lambda texts: projected[[retrieval.rows[t] for t in texts]], retrieval.split)
    return retrieval_metrics(retrieval.split.qrels, run)["ndcg@10"]


def epoch_scores(head: CompressionHead, data: HeadTrainingData) -> dict[str, float]:
    """An epoch's selection scores: the dev sets' (`head_dev_scores`), the retrieval split's
    nDCG@10 when it chooses, and SELECT_METRIC, a copy of the one that chooses."""
    scores = head_dev_scores(head, data.dev)
    if data.retrieval is not None:
        scores[data.retrieval.metric] = head_retrieval_score(head, data.retrieval)
    scores[SELECT_METRIC] = scores[data.select_key()]
    return scores


def best_epoch(history: list[dict], select_key: str) -> int:
    """The epoch a head is kept at: the highest `select_key` (HeadTrainingData.select_key:
    dev_avg, or the nDCG@10 of the split eval.select_by names), the earlier on a tie; a row
    whose score is NaN never wins over the first row."""
    best = history[0]
    for row in history[1:]:
        if row[select_key] > best[select_key]:
            best = row
    return best["epoch"]


def _batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """A shuffled pass over n rows; a last batch shorter than half a batch joins the previous."""
    order = torch.randperm(n, generator=generator)
    batches = list(torch.split(order, batch_size))
    if len(batches) > 1 and len(batches[-1]) < batch_size // 2:
        last = batches.pop()  # popped first: `batches[-2] = cat(..., pop())` indexes after it
        batches[-1] = torch.cat([batches[-1], last])
    return batches


def train_head(
    output_dim: int,
    data: HeadTrainingData,
    head_config: HeadConfig,
    loss_config: MCR2LossConfig,
    assignment_config: AssignmentConfig,
    optim: HeadTrainingConfig,
    log_every: int = 1,
) -> TrainedHead:
    """Train a head to `output_dim`; return it at its best epoch by `data.select_key()` (the dev
    sets' ``dev_avg``, or the retrieval split's nDCG@10; on a tie the earlier epoch). A log line
    every `log_every` epochs and at the last (`history` holds every epoch)."""
    start = time.perf_counter()
    torch.manual_seed(optim.seed)
    generator = torch.Generator().manual_seed(optim.seed)
    x = torch.from_numpy(np.ascontiguousarray(data.sentences, dtype=np.float32))  # (n, D)
    n, input_dim = x.shape
    head = CompressionHead(
        input_dim, output_dim, head_config.hidden_dims, head_config.activation, head_config.dropout
    )
    if head_config.starts_at_pca():
        pca = fit_pca_model(data.sentences, output_dim, optim.seed)
        head.start_at_projection(pca.mean_, pca.components_)
    learned = assignment_config.source == "learned"
    if not learned and data.cluster_ids is None:
        raise ValueError("cluster ids are needed unless assignments.source is 'learned'")
    clusters = None if learned else torch.from_numpy(np.asarray(data.cluster_ids, np.int64))
    # The assignment head reads the frozen encoder vector (the "backbone feature"), as in
    # NMCE (Li et al. 2022), so Π does not chase the head's moving output.
    assigner = (
        SoftAssignmentHead(input_dim, assignment_config.num_clusters, assignment_config.temperature)
        if learned
        else None
    )
    params = list(head.parameters()) + (list(assigner.parameters()) if assigner else [])
    optimiser = torch.optim.AdamW(params, lr=optim.learning_rate, weight_decay=optim.weight_decay)
    loss_fn = MCR2Loss(loss_config)
    if data.pairs is not None:
        anchors = torch.from_numpy(np.ascontiguousarray(data.pairs[0], dtype=np.float32))
        positives = torch.from_numpy(np.ascontiguousarray(data.pairs[1], dtype=np.float32))
        pair_order = torch.randperm(len(anchors), generator=generator)
        pair_cursor = 0

    select_key = data.select_key()
    chosen_keys = (*data.dev, "dev_avg", *([select_key] if data.retrieval else []))
    start_scores = epoch_scores(head, data)
    best = {"epoch": 0, "dev": {k: start_scores[k] for k in chosen_keys}}
    best_state = (
        copy.deepcopy(head.state_dict()),
        assigner and copy.deepcopy(assigner.state_dict()),
    )
    history = [{"epoch": 0, **start_scores}]
    for epoch in range(1, optim.epochs + 1):
        head.train()
        sums: dict[str, float] = {}
        batches = _batches(n, optim.batch_size, generator)
        for rows in batches:
            batch = x[rows]  # (B, D) the encoder's vectors: the head's input and its teacher
            z = head(batch)  # (B, d)
            pi = assigner(batch) if assigner else clusters[rows]  # (B, k) or (B,)
            views = None
            if data.pairs is not None:
                if pair_cursor + optim.pair_batch_size > len(pair_order):
                    pair_order = torch.randperm(len(anchors), generator=generator)
                    pair_cursor = 0
                take = pair_order[pair_cursor : pair_cursor + optim.pair_batch_size]
                pair_cursor += len(take)
                views = (head(anchors[take]), head(positives[take]))  # 2 × (m, d)
            loss, metrics = loss_fn(z, pi, views, teacher=batch)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
        row = {"epoch": epoch, **{k: v / len(batches) for k, v in sums.items()}}
        row.update(epoch_scores(head, data))
        history.append(row)
        if best_epoch(history, select_key) == epoch:
            best = {"epoch": epoch, "dev": {k: row[k] for k in chosen_keys}}
            best_state = (
                copy.deepcopy(head.state_dict()),
                assigner and copy.deepcopy(assigner.state_dict()),
            )
        if epoch % log_every and epoch != optim.epochs:
            continue
        log.info(
            "dim %d epoch %d: loss %.4e, ΔR %.3f, dev avg %.2f%s",
            output_dim,
            epoch,
            row.get("loss", float("nan")),
            row.get("rate_reduction", float("nan")),
            row["dev_avg"],
            f", {select_key} {row[select_key]:.2f}" if data.retrieval else "",
        )
    head.load_state_dict(best_state[0])
    head.eval()
    if assigner is not None:
        assigner.load_state_dict(best_state[1])
        assigner.eval()
    return TrainedHead(
        head,
        assigner,
        best["epoch"],
        best["dev"],
        best["dev"][select_key],
        history,
        time.perf_counter() - start,
    )
