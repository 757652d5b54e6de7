import pytest
import torch

from distributed_emb.losses.distillation import distillation_loss, similarity_distillation_loss
from distributed_emb.losses.info_nce import info_nce_loss
from distributed_emb.losses.loss_config import LossConfig
from distributed_emb.train.step import embedding_objective


def test_distillation_is_the_mean_of_both_views_element_mse():
    z1 = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    z2 = torch.tensor([[1.0, 0.0], [3.0, 4.0]])
    teacher = torch.tensor([[1.0, 1.0], [0.0, 4.0]])
    # view 1: squared errors 0, 1, 0, 16 → 17/4; view 2: 0, 1, 9, 0 → 10/4; half their sum 27/8
    targets = torch.cat([teacher, teacher])
    assert float(distillation_loss(z1, z2, targets)) == pytest.approx(27 / 8)
    # Pairs: each view has its own target (anchor, positive).
    other = torch.tensor([[1.0, 0.0], [3.0, 4.0]])  # = z2: view 2 costs nothing
    assert float(distillation_loss(z1, z2, torch.cat([teacher, other]))) == pytest.approx(17 / 8)


def test_gradient_reaches_the_student_never_the_teacher():
    z1 = torch.randn(4, 3, requires_grad=True)
    z2 = torch.randn(4, 3, requires_grad=True)
    targets = torch.randn(8, 3, requires_grad=True)
    distillation_loss(z1, z2, targets).backward()
    # ∂/∂z1 of mean((z − t)²) over 24 elements = 2 (z1 − t¹) / 24
    assert torch.allclose(z1.grad, 2 * (z1 - targets[:4]).detach() / 24)
    assert targets.grad is None


def test_a_teacher_of_another_dimension_is_refused_with_both_shapes():
    with pytest.raises(ValueError, match=r"teacher vectors \(4, 5\) .* student's \(4, 3\)"):
        distillation_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(4, 5))


def test_objective_adds_the_weighted_term_and_can_drop_the_contrastive_one():
    torch.manual_seed(0)
    z1, z2, targets = torch.randn(6, 4), torch.randn(6, 4), torch.randn(12, 4)
    nce = info_nce_loss(z1, z2, 0.05, True, None)
    mse = distillation_loss(z1, z2, targets)

    both = LossConfig(reconstruction_weight=0.0, distill_weight=2.0)
    loss, metrics = embedding_objective(z1, z2, both, teacher_vectors=targets)
    assert float(loss) == pytest.approx(float(nce + 2.0 * mse), rel=1e-6)
    assert float(metrics["loss_distill"]) == pytest.approx(float(mse))

    # Plain distillation: no InfoNCE at all (no gather, no metric for it).
    plain = LossConfig(contrastive_weight=0.0, reconstruction_weight=0.0, distill_weight=1.0)
    loss, metrics = embedding_objective(z1, z2, plain, teacher_vectors=targets)
    assert float(loss) == pytest.approx(float(mse), rel=1e-6)
    assert "loss_contrastive" not in metrics

    with pytest.raises(ValueError, match="no teacher vectors"):
        embedding_objective(z1, z2, plain)


def test_the_default_weights_give_exactly_the_infomin_objective():
    """α = 1, δ = 0: the same number, bit for bit, as InfoNCE + λ·L_R alone."""
    from distributed_emb.losses.reconstruction import reconstruction_loss

    torch.manual_seed(1)
    z1, z2 = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    loss, _ = embedding_objective(z1, z2, LossConfig(reconstruction_weight=0.1))
    expected = info_nce_loss(z1, z2, 0.05, True, None) + 0.1 * reconstruction_loss(
        z1, z2, "normalized_mse"
    )
    assert torch.equal(loss, expected)


def _reference_similarity_kl(z, teacher, temperature):
    """Plain per-row loops in float64: each row's softmax over its cosines to the other rows."""
    z = torch.nn.functional.normalize(z.double(), dim=1)
    t = torch.nn.functional.normalize(teacher.double(), dim=1)
    n = z.shape[0]
    total = 0.0
    for i in range(n):
        others = [j for j in range(n) if j != i]
        p = torch.softmax(torch.stack([t[i] @ t[j] for j in others]) / temperature, 0)
        q = torch.softmax(torch.stack([z[i] @ z[j] for j in others]) / temperature, 0)
        total += float((p * (p.log() - q.log())).sum())
    return total / n


def test_similarity_distillation_matches_a_per_row_reference():
    torch.manual_seed(0)
    z, teacher = torch.randn(9, 4), torch.randn(9, 12)
    for temperature in (0.05, 0.5):
        got = float(similarity_distillation_loss(z, teacher, temperature))
        assert got == pytest.approx(_reference_similarity_kl(z, teacher, temperature), rel=1e-4)
        assert got > 0


def test_similarity_distillation_is_zero_when_the_neighbours_are_the_teachers():
    torch.manual_seed(1)
    teacher = torch.randn(16, 6)
    rotation, _ = torch.linalg.qr(torch.randn(6, 6))
    # A rotation and a rescaling keep every cosine, so nothing is left to distil, even though
    # the vectors themselves differ.
    z = 3.0 * teacher @ rotation
    assert float(similarity_distillation_loss(z, teacher)) == pytest.approx(0.0, abs=1e-5)


def test_similarity_distillation_sends_no_gradient_to_the_teacher():
    z = torch.randn(6, 3, requires_grad=True)
    teacher = torch.randn(6, 8, requires_grad=True)
    similarity_distillation_loss(z, teacher).backward()
    assert z.grad is not None and float(z.grad.abs().sum()) > 0
    assert teacher.grad is None


@pytest.mark.parametrize(
    ("z", "teacher", "temperature", "message"),
    [
        (torch.randn(4, 3), torch.randn(5, 3), 0.05, "same n"),
        (torch.randn(1, 3), torch.randn(1, 3), 0.05, "at least 2 rows"),
        (torch.randn(4, 3), torch.randn(4, 3), 0.0, "temperature must be > 0"),
    ],
)
def test_similarity_distillation_rejects_bad_input(z, teacher, temperature, message):
    with pytest.raises(ValueError, match=message):
        similarity_distillation_loss(z, teacher, temperature)
