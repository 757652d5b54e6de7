"""The frozen teacher of the distillation term (`loss.distill_teacher`, losses/distillation.py)
and of the MCR² term's neighbourhood part (`loss.mcr2.distill_weight`; teacher: the starting
model unless `loss.distill_teacher` names another).

Every Train worker holds its own copy in eval mode (no dropout: the target is the teacher's
vector, not a noisy view) and embeds each batch with it, without a graph, before the step.
The teacher reads the student's token ids, so the two must share a vocabulary, and their
vectors are compared element by element, so they must have the same width: check_teacher
verifies both on the driver before Ray Train is asked for anything (MCR²'s term compares
in-batch similarities, so its teacher may be wider than the compressed student). The
teacher pools as the student does (`model.pooler`); modules a sentence-transformers teacher
adds after pooling (Dense, Normalize) are not applied.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoTokenizer

from distributed_emb.checks import ConfigError
from distributed_emb.losses.loss_config import LossConfig
from distributed_emb.model.encoder import TrainableEncoder
from distributed_emb.model.model_config import ModelConfig


def check_teacher(model: ModelConfig, loss: LossConfig) -> None:
    """Refuse, naming the key, a teacher whose vocabulary or width differs from the student's."""
    teacher = loss.distill_teacher
    if teacher is None:  # none, or MCR²'s default: the starting model itself
        return
    student, trust = model.local_path(), model.trust_remote_code
    teacher_vocab = AutoTokenizer.from_pretrained(teacher, trust_remote_code=trust).get_vocab()
    student_vocab = AutoTokenizer.from_pretrained(student, trust_remote_code=trust).get_vocab()
    if teacher_vocab != student_vocab:
        raise ConfigError(
            f"loss.distill_teacher: {teacher}'s vocabulary ({len(teacher_vocab)} tokens) is not "
            f"model.path {student}'s ({len(student_vocab)}): the teacher embeds the student's "
            "token ids, so both need the same tokenizer"
        )
    if loss.distill_weight == 0:  # MCR²'s term alone compares similarities, not vectors
        return
    widths = [
        AutoConfig.from_pretrained(path, trust_remote_code=trust).hidden_size
        for path in (teacher, student)
    ]
    if widths[0] != widths[1]:
        raise ConfigError(
            f"loss.distill_teacher: {teacher} embeds in {widths[0]} dimensions, model.path "
            f"{student} in {widths[1]}: the distillation term compares them element by element"
        )


class Teacher:
    """(2B, L) batch → (2B, d) teacher vectors. Rows of the two views that are the same text
    (a sentence corpus) are embedded once."""

    def __init__(self, model: ModelConfig, loss: LossConfig, device: torch.device):
        self.encoder = TrainableEncoder(
            loss.distill_teacher or model.local_path(),
            pooler=model.pooler,
            mlp_head=False,
            trust_remote_code=model.trust_remote_code,
        )
        self.encoder.eval().requires_grad_(False).to(device)

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor], autocast) -> torch.Tensor:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        rows = ids.shape[0] // 2
        same_text = torch.equal(ids[:rows], ids[rows:])
        if same_text:
            ids, mask = ids[:rows], mask[:rows]
        with autocast():
            vectors = self.encoder(ids, mask).float()
        return torch.cat([vectors, vectors]) if same_text else vectors
