"""GradCache: one training step over a big batch at the memory of a mini-batch.

The contrastive loss couples every row with every other (InfoNCE over the gathered global
batch), so a big batch cannot simply be split into accumulated micro-batches: that would shrink
the negatives. GradCache (Gao et al., "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup", 2021; https://github.com/luyug/GradCache) splits the *encoder* work instead:

1. Embed the local batch in mini-batches of m sentences with no graph, recording the RNG state
   before each mini-batch (both views of a sentence travel together, so each mini-batch holds
   rows i and B+i of the (2B, L) batch, and row i's hard negative when the batch has them).
2. Concatenate the embeddings into leaf tensors z1, z2 (and the negatives' z) (B, d), compute
   the full objective exactly as the plain step does (InfoNCE over the gathered global batch,
   hard negatives included, + λ·reconstruction, same-group masking) and take ∂loss/∂z (the
   gather's backward all-reduces these across workers, so each rank gets the gradient of the
   global loss w.r.t. its own rows).
3. Re-run each mini-batch with the graph, restoring its RNG state so every dropout mask is the
   one used in step 1, and backpropagate the cached gradient: backward of Σ z ⊙ ∂loss/∂z. By
   the chain rule the summed parameter gradients equal those of one forward over the whole
   batch with the same dropout masks.

Without the RNG replay the re-run draws new dropout masks: the gradient is then that of a
different function from the one the loss was computed on, with no error anywhere. The test
suite checks that removing the replay changes the gradients.

Dropout masks of "the same batch and seeds": a mask is drawn per forward call, so a forward over
all 2B rows and m-row forwards draw different masks from the same seed. The cached step equals
the plain step (forward_objective) whose forward runs the same mini-batches one after another
from the same RNG state; with m ≥ B, or with dropout off, it equals plain_step itself.

β·L_MLM: the MLM loss is per token and local to each rank. The plain step's L_MLM is the mean
over the N masked tokens of the local batch; with n_j masked tokens in mini-batch j and mean
L_j there, L_MLM = Σ_j (n_j / N) · L_j, so mini-batch j backpropagates β · (n_j / N) · L_j in
its re-run pass (no caching needed). Step 1 runs the MLM forward too, though its logits are not
needed there: both passes must consume the RNG identically, or the MLM dropout of mini-batch j
would reuse the random numbers that mini-batch j+1's view masks are drawn from.

Cost: one extra no-grad forward per sentence (≈ +30–40% compute over a plain step); memory
is that of one m-row mini-batch plus (B, d) cached embeddings and the (B, G) logits (G: the
global batch).

Engines:
- DDP: only the last mini-batch's backward all-reduces; the others run in `no_sync()`, so
  gradients are all-reduced once per step (and none when `sync` is False, for gradient
  accumulation across loop micro-batches).
- DeepSpeed (distributed_emb/train/deepspeed_engine.py, deepspeed 0.19.8): several
  engine.backward calls per optimizer step are DeepSpeed's own gradient-accumulation pattern.
  The mini-batches before the last run with `set_gradient_accumulation_boundary(False)` (its
  documented way to add backward calls and step once) and call DeepSpeed's backward directly;
  the last one goes through the engine wrapper at DeepSpeed's own boundary, so the wrapper's
  micro-batch counting (train.gradient_accumulation_steps) is unchanged. Both are the
  engine's `mini_batch_scope` / `mini_batch_backward` hooks (train/engine.py `Engine`).
  Checked equal to the plain gradients at ZeRO-0/1/2/3 (tests: ZeRO-2 and 3 with accumulation
  2). Without the boundary override ZeRO-1/2 with accumulation gave wrong gradients, silently.
  What each stage costs on top of DDP: ZeRO-1 reduces once per step, as DDP; ZeRO-2
  reduce-scatters every mini-batch's gradients into the partitions (k reductions per step
  instead of one: more traffic, same result); ZeRO-3 gathers the partitioned parameters in
  every forward and backward: 3k all-gathers of the model per step (no-grad pass, re-run,
  backward) plus k reduce-scatters. That is where GradCache and ZeRO-3 stop composing
  *efficiently*: ZeRO-3 saves parameter memory, GradCache activation memory, and together the
  communication grows with the number of mini-batches. (`engine.no_sync()` itself is refused
  by DeepSpeed at ZeRO ≥ 2, hence the boundary override rather than no_sync.)
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.checkpoint import get_device_states, set_device_states

from distributed_emb import distributed
from distributed_emb.data.collate import NEGATIVE_KEYS
from distributed_emb.losses.loss_config import LossConfig
from distributed_emb.losses.mlm import mlm_loss
from distributed_emb.train.engine import Engine
from distributed_emb.train.step import (
    _full_precision,
    add_mlm_term,
    embedded_rows,
    embedding_objective,
    global_means,
    has_negatives,
    rank_weight,
)

MLM_KEYS = ("mlm_input_ids", "mlm_attention_mask", "mlm_labels")


class RandContext:
    """The RNG state at construction (CPU, and the accelerator holding `tensors`), replayed on
    enter; leaving restores the state the generators had on entering (torch.random.fork_rng),
    so a replayed forward does not disturb the random stream the step continues from.

    After the GradCache reference code (luyug/GradCache; also sentence-transformers'
    CachedMultipleNegativesRankingLoss).
    """

    def __init__(self, *tensors: torch.Tensor):
        self.cpu_state = torch.get_rng_state()
        accelerated = [t for t in tensors if t.device.type not in ("cpu", "meta")]
        self.device_type = accelerated[0].device.type if accelerated else None
        self.devices, self.device_states = get_device_states(*accelerated)
        self._fork = None

    def __enter__(self) -> RandContext:
        self._fork = torch.random.fork_rng(devices=self.devices, device_type=self.device_type)
        self._fork.__enter__()
        torch.set_rng_state(self.cpu_state)
        set_device_states(self.devices, self.device_states, device_type=self.device_type)
        return self

    def __exit__(self, *exc) -> None:
        self._fork.__exit__(*exc)
        self._fork = None


def split_mini_batches(
    batch: dict[str, torch.Tensor], mini_batch_size: int, use_mlm: bool
) -> list[dict[str, torch.Tensor]]:
    """(2B, L) batch → mini-batches of m sentences, each (2m_j, L_j) with both views, or
    (3m_j, L_j) with their hard negatives too.

    Mini-batch j holds rows [jm, jm+m) (first views) then [B+jm, B+jm+m) (their second views),
    then, when the batch has hard negatives, rows [jm, jm+m) of the negatives' block (the order
    of step.embedded_rows), and, with MLM, the masked copies of rows [jm, jm+m). Trailing
    columns that are padding in every row of the mini-batch are cut (right padding: positions
    of real tokens do not move), so short mini-batches cost less.
    """
    if mini_batch_size < 1:
        raise ValueError(f"mini_batch_size must be >= 1, got {mini_batch_size}")
    rows = batch["input_ids"].shape[0]
    if rows % 2:
        raise ValueError(f"input_ids has {rows} rows; expected 2B (two views of B sentences)")
    sentences = rows // 2
    negatives = has_negatives(batch)
    if negatives and batch[NEGATIVE_KEYS[0]].shape[0] != sentences:
        raise ValueError(
            f"{NEGATIVE_KEYS[0]} has {batch[NEGATIVE_KEYS[0]].shape[0]} rows; expected B = "
            f"{sentences} (one hard negative a sentence)"
        )
    input_ids, attention_mask = embedded_rows(batch)  # (2B or 3B, L)
    blocks = 3 if negatives else 2
    device = batch["input_ids"].device
    mini_batches = []
    for start in range(0, sentences, mini_batch_size):
        stop = min(start + mini_batch_size, sentences)
        first = torch.arange(start, stop, device=device)
        chosen = torch.cat([first + block * sentences for block in range(blocks)])  # (2m_j|3m_j,)
        mini = _trim_padding(
            {"input_ids": input_ids[chosen], "attention_mask": attention_mask[chosen]},
            "attention_mask",
        )
        if use_mlm:
            mini.update(_trim_padding({k: batch[k][first] for k in MLM_KEYS}, "mlm_attention_mask"))
        mini_batches.append(mini)
    return mini_batches


def _filler(mini: dict[str, torch.Tensor], use_mlm: bool, blocks: int) -> dict[str, torch.Tensor]:
    """A one-sentence mini-batch (the first of `mini`, each of its `blocks`: both views [and
    the negative]) with no masked MLM token, so it can be run for the collectives it makes and
    add nothing to the loss."""
    rows = mini["input_ids"].shape[0] // blocks
    each = [block * rows for block in range(blocks)]
    filler = {"input_ids": mini["input_ids"][each], "attention_mask": mini["attention_mask"][each]}
    if use_mlm:
        filler.update({key: mini[key][:1] for key in MLM_KEYS})
        filler["mlm_labels"] = torch.full_like(filler["mlm_labels"], -100)
    return filler


def _trim_padding(tensors: dict[str, torch.Tensor], mask_key: str) -> dict[str, torch.Tensor]:
    real = tensors[mask_key].any(dim=0).nonzero()
    length = int(real.max()) + 1 if real.numel() else 1
    return {key: value[:, :length] for key, value in tensors.items()}


def forward_mini_batch(
    forward_module, mini: dict[str, torch.Tensor], use_mlm: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward call, as forward_objective makes it: (2m, d) embeddings, (3m, d) with hard
    negatives [, (m, L, V) logits]."""
    outputs = forward_module(
        mini["input_ids"],
        mini["attention_mask"],
        mlm_input_ids=mini["mlm_input_ids"] if use_mlm else None,
        mlm_attention_mask=mini["mlm_attention_mask"] if use_mlm else None,
    )
    return outputs if use_mlm else (outputs, None)


def cached_step(
    engine: Engine,
    batch: dict[str, torch.Tensor],
    weights: LossConfig,
    mini_batch_size: int,
    sync: bool,
    replay_rng: bool = True,
) -> dict[str, torch.Tensor]:
    """Forward + backward of one (micro-)batch in mini-batches of `mini_batch_size` sentences.

    Same metrics as plain_step (loss, loss_contrastive[, loss_reconstruction][, loss_mlm]) and
    the same parameter gradients as the plain step on the same mini-batches' dropout masks.
    `sync=False` accumulates without all-reducing (gradient accumulation). `replay_rng=False`
    exists only so a test can show the replay matters: never use it to train.
    """
    use_mlm = weights.mlm_weight > 0 and "mlm_input_ids" in batch
    negatives = has_negatives(batch)
    blocks = 3 if negatives else 2  # embedded rows a sentence: both views [and its negative]
    sizes = distributed.gather_sizes(batch["input_ids"].shape[0] // 2)  # every rank's B_r
    mini_batches = split_mini_batches(batch, mini_batch_size, use_mlm)
    sentences = [mini["input_ids"].shape[0] // blocks for mini in mini_batches]
    # Every rank runs as many mini-batches as the one with the most rows: under ZeRO-2/3 each
    # forward and backward makes collectives. A rank whose slice is a row shorter makes up the
    # count with a filler, its first sentence again, which adds nothing to the gradient.
    fillers = -(-max(sizes) // mini_batch_size) - len(mini_batches)
    mini_batches += [_filler(mini_batches[0], use_mlm, blocks)] * fillers
    sentences += [0] * fillers

    # 1. Embed without a graph, remembering the RNG state each mini-batch started from.
    rng_states, cached = [], [[] for _ in range(blocks)]  # per block: (m_j, d) pieces
    with torch.no_grad():
        for mini, rows in zip(mini_batches, sentences, strict=True):
            rng_states.append(RandContext(mini["input_ids"]))
            with engine.autocast():
                z, _ = forward_mini_batch(engine.forward_module, mini, use_mlm)  # (2m|3m, d)
            for pieces, part in zip(cached, _full_precision(z).chunk(blocks), strict=True):
                pieces.append(part[:rows])

    # 2. The full objective on the cached embeddings, and its gradient w.r.t. each of them,
    # weighted as the plain step weights its loss (unequal slices: step.rank_weight).
    leaves = [torch.cat(pieces).requires_grad_() for pieces in cached]  # (B, d) leaves
    z1, z2 = leaves[:2]
    z_negative = leaves[2] if negatives else None
    weight = rank_weight(sizes)
    with engine.autocast():
        loss, metrics = embedding_objective(
            z1, z2, weights, batch.get("groups"), batch.get("teacher_vectors"), sizes, z_negative
        )
    # The gather's backward all-reduces.
    grads = torch.autograd.grad(loss * weight, leaves)

    # 3. Re-run each mini-batch with its dropout masks and push the cached gradients through.
    masked_total = int((batch["mlm_labels"] != -100).sum()) if use_mlm else 0
    mlm_weighted = torch.zeros((), dtype=z1.dtype, device=z1.device)
    start = 0
    for index, (mini, rows, rng) in enumerate(
        zip(mini_batches, sentences, rng_states, strict=True)
    ):
        last = index == len(mini_batches) - 1
        stop = start + rows
        with engine.mini_batch_scope(last=last, synchronise=sync and last):
            with rng if replay_rng else contextlib.nullcontext():
                with engine.autocast():
                    z, logits = forward_mini_batch(engine.forward_module, mini, use_mlm)
            z = _full_precision(z)
            if rows:
                cached_grad = torch.cat([grad[start:stop] for grad in grads])  # (2m|3m, d)
                surrogate = (z * cached_grad).sum()  # ∂surrogate/∂z = ∂loss/∂z
            else:  # a filler: in the graph (DDP expects every parameter), with no gradient
                surrogate = z.sum() * 0.0
            if use_mlm:
                mlm = mlm_loss(_full_precision(logits), mini["mlm_labels"])
                # Token-count weights make Σ_j the mean over all N masked tokens (plain step).
                share = (
                    int((mini["mlm_labels"] != -100).sum()) / masked_total if masked_total else 0.0
                )
                surrogate = surrogate + weight * weights.mlm_weight * share * mlm
                mlm_weighted = mlm_weighted + share * mlm.detach()
            engine.mini_batch_backward(surrogate, last)
        start = stop

    loss = add_mlm_term(loss.detach(), metrics, mlm_weighted if use_mlm else None, weights)
    metrics["loss"] = loss.detach()
    return global_means(metrics, weight)
