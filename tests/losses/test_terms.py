"""The table of loss terms (losses/terms.py): every weight of the `loss` section has its row, and
the model card names exactly the terms a run trains with. No Ray, no training: the configs come
from the jobs' own loader, the card text from the driver's card builder."""

from __future__ import annotations

import dataclasses

import pytest
from harness.jobs import job_module

from distributed_emb.checks import ConfigError
from distributed_emb.cli import job_config
from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.losses.loss_config import LossConfig
from distributed_emb.losses.terms import BY_KEY, TERMS
from distributed_emb.model.model_card import training_section
from distributed_emb.train.run_card import card_info


def test_every_weight_of_the_loss_section_has_a_row():
    weights = {f.name for f in dataclasses.fields(LossConfig) if f.name.endswith("_weight")}
    missing = sorted(weights - set(BY_KEY))
    assert not missing, f"give these a row in losses/terms.py TERMS: {missing}"
    assert set(BY_KEY) <= weights, "a row's weight_key is not a field of LossConfig"


def test_each_row_is_complete_and_its_own():
    for term in TERMS:
        assert term.name and term.symbol and term.description and term.citation, term
        assert callable(term.compute) and callable(term.settings), term
        assert term.settings(LossConfig()), term
    for field in ("name", "symbol", "weight_key"):
        values = [getattr(term, field) for term in TERMS]
        assert len(set(values)) == len(values), f"two rows share a {field}: {values}"
    # A card line names a term by its name: no name may be read inside another's row.
    for term in TERMS:
        for other in TERMS:
            if other is not term:
                text = f"{other.name} {other.description} {other.citation}"
                assert term.name not in text, f"{term.name!r} is read in {other.name}'s row"


def test_the_config_check_names_every_term():
    zero = [f"loss.{term.weight_key}=0" for term in TERMS]
    with pytest.raises(ConfigError, match="^loss: every term has weight 0") as raised:
        load_config(TrainingConfig, None, zero)
    assert all(term.key in str(raised.value) for term in TERMS)


def _card(job: str, argv: list[str]) -> tuple[TrainingConfig, str, str]:
    """The job's config, and the card's method and objective lines (what the run's export
    would publish)."""
    config = job_config(job_module(job).JOB, argv)
    section = training_section(card_info(config, command="python x.py"))
    lines = {
        line.split(":** ")[0]: line.split(":** ", 1)[1]
        for line in section.splitlines()
        if line.startswith("- **")
    }
    return config, lines["- **Method"], lines["- **Objective"]


@pytest.mark.parametrize(
    "job, argv, weighted",
    [
        # MCR² fine-tuning: α = λ = 0, γ = 1; its corpus must only exist to load.
        ("finetune_mcr2", ["data.path={corpus}"], {"mcr2_weight"}),
        # InforMin-CL pulled toward the given model.
        (
            "train_informin",
            ["loss.distill_weight=0.1", "model.mlp_head=none"],
            {"contrastive_weight", "reconstruction_weight", "distill_weight"},
        ),
    ],
)
def test_the_card_names_exactly_the_terms_with_a_weight(tmp_path, job, argv, weighted):
    corpus = tmp_path / "training_sentences.parquet"
    corpus.write_bytes(b"")
    config, method, objective = _card(job, [a.format(corpus=corpus) for a in argv])
    assert {term.weight_key for term in TERMS if term.weight(config.loss) > 0} == weighted
    for term in TERMS:
        on = term.weight_key in weighted
        assert (term.name in method) is on, f"{term.name} in the method line: {method}"
        assert (term.name in objective) is on, f"{term.name} in the objective line: {objective}"
        assert (f"{term.symbol} = " in objective) is on, objective
        if on:
            assert f"{term.symbol} = {term.weight(config.loss):g} × {term.name}" in objective
            assert term.citation in method
    if "contrastive_weight" not in weighted:
        assert "negatives" not in objective and "InforMin-CL" not in method
