"""Distillation terms: pull a student's vectors, or their similarities, onto a frozen teacher's.

``distillation_loss`` (L_D) is the vector-to-vector term of InforMin-CL and InfoCSE runs;
``similarity_distillation_loss`` keeps a compression head's in-batch neighbours those of the
encoder it compresses (the MCR² head's distillation term, mcr2/train.py).

L_D, the plain peer a user reaches for when shrinking an encoder (sentence-transformers' MSELoss):
the element-mean squared error between each row's vector and the teacher's vector of the same
text,

    L_D = ½ · (MSE(z¹, t¹) + MSE(z², t²)),

where t¹, t² are the teacher's vectors of the rows behind z¹ and z² (for a sentence corpus the
same sentence twice, so t¹ = t²; for pairs, the anchor's and the positive's). Pooled vectors
before any normalisation: what the exported model normalises, if it does, it normalises in
both. The teacher runs without dropout (train/teacher.py), so t is a target, not a third view.
Local to each row: no gather.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def distillation_loss(z1: torch.Tensor, z2: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """z1, z2: (B, d) the two views; targets: (2B, d) the teacher's vectors of the rows behind
    z1 then z2 (no gradient reaches them)."""
    z = torch.cat([z1, z2])
    if targets.shape != z.shape:
        raise ValueError(
            f"teacher vectors {tuple(targets.shape)} do not match the student's "
            f"{tuple(z.shape)}: the teacher and the student must have the same dimension"
        )
    # Equal halves: the mean over 2B rows is the mean of the two views' MSEs.
    return F.mse_loss(z, targets.detach().to(z.dtype))


def similarity_distillation_loss(
    z: torch.Tensor, teacher: torch.Tensor, temperature: float = 0.05
) -> torch.Tensor:
    """KL(P_teacher ‖ P_student) of each row's softmax over its cosine similarities to the
    other rows of the batch, at `temperature`; mean over rows.

    z: (n, d) the student's vectors; teacher: (n, D) the teacher's vectors of the same rows
    (any D: only their similarities are compared, so a 64-d head can match a 384-d encoder).
    Relational distillation: unlike an MSE over all similarities, which the many unrelated
    pairs dominate, the softmax weights each row's nearest neighbours most, the pairs that
    similarity search and STS ranking depend on. Each row's own similarity is left out.
    """
    if z.dim() != 2 or teacher.dim() != 2 or z.shape[0] != teacher.shape[0]:
        raise ValueError(
            f"similarity distillation needs (n, d) and (n, D) with the same n; got "
            f"{tuple(z.shape)} and {tuple(teacher.shape)}"
        )
    if z.shape[0] < 2:
        raise ValueError("similarity distillation needs at least 2 rows in the batch")
    if temperature <= 0:
        raise ValueError(f"similarity distillation temperature must be > 0, got {temperature}")
    student = F.normalize(z, dim=1)
    target = F.normalize(teacher.detach().to(z.dtype), dim=1)
    self_pairs = torch.eye(z.shape[0], dtype=torch.bool, device=z.device)
    # A large negative logit, not -inf: -inf·0 in the KL's target terms would give NaN.
    student_logits = (student @ student.T).masked_fill(self_pairs, -1e4) / temperature  # (n, n)
    teacher_logits = (target @ target.T).masked_fill(self_pairs, -1e4) / temperature  # (n, n)
    return F.kl_div(
        F.log_softmax(student_logits, dim=1),
        F.log_softmax(teacher_logits, dim=1),
        log_target=True,
        reduction="batchmean",
    )
