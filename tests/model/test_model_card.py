"""Exports people can share: a filled model card, the base model's length, hub settings."""

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.model.model_card import (
    PACKAGED_MODEL_ID,
    SECTION_TITLE,
    add_card_lines,
    base_model_card,
    export_max_seq_length,
    training_section,
)
from distributed_emb.train.run_card import card_info, finalize_export

LONG_TEXT = " ".join(
    f"Sentence number {i} of a long paragraph talks about rivers, cities and music."
    for i in range(20)
)


def _fake_checkpoint(config, directory, history):
    """What the training loop leaves in a checkpoint: weights + the loop state's history."""
    from distributed_emb.train.checkpointing import (
        MODEL_FILE,
        STATE_FILE,
        LoopState,
        save_module_weights,
    )
    from distributed_emb.train.worker import build_encoder

    torch.manual_seed(0)
    encoder = build_encoder(config.model, config.loss, config.train)
    with torch.no_grad():  # move away from the initial weights, as training would
        for p in encoder.parameters():
            p.add_(0.01 * torch.randn_like(p))
    directory.mkdir()
    save_module_weights(encoder.state_dict(), str(directory / MODEL_FILE))
    (directory / STATE_FILE).write_text(LoopState(step=20, history=history).to_json())
    return str(directory)


@pytest.mark.slow
def test_export_is_a_shareable_model_with_its_card_and_full_length(tiny_bert_path, tmp_path):
    from distributed_emb.train.driver import export_checkpoint

    config = load_config(
        TrainingConfig,
        None,
        [
            f"model.path={tiny_bert_path}",
            "model.max_seq_length=32",  # the training length: not the export's
            "loss.reconstruction_weight=0.2",
            "loss.temperature=0.07",
            "train.learning_rate=2e-5",
            "export.license=apache-2.0",
        ],
    )
    history = [  # chosen on STS-B dev (the default eval.select_by): select_score is it
        {"step": 0, "epoch": 0, "stsb_dev_spearman": 50.0, "select_score": 50.0},
        {"step": 10, "epoch": 0, "stsb_dev_spearman": 61.5, "select_score": 61.5, "loss": 1.25},
        {"step": 20, "epoch": 0, "stsb_dev_spearman": 60.0, "select_score": 60.0, "loss": 1.0},
    ]
    checkpoint = _fake_checkpoint(config, tmp_path / "ckpt", history)
    out = export_checkpoint(config, checkpoint, str(tmp_path / "model"))

    readme = (tmp_path / "model" / "README.md").read_text()
    front = readme.split("---")[1]
    assert "license: apache-2.0" in front
    assert "- distributed_emb" in front  # tag
    assert "sts-dev" in front  # the dev score as an evaluation result (model-index)
    assert "InforMin-CL" in readme
    assert "τ = 0.07" in readme and "λ = 0.2" in readme
    assert "Wikipedia sentences shipped with distributed_emb" in readme
    assert "**Maximum Sequence Length:** 128 tokens" in readme  # the tiny BERT's positions
    assert "trained at 32 tokens" in readme
    assert "`train.learning_rate`: 2e-05" in readme  # a non-default hyperparameter
    assert "STS-B dev, exported (step 10) | 61.50" in readme
    assert "Trained with:" in readme

    # A fresh interpreter, sentence-transformers only: what someone we share the model with runs.
    script = textwrap.dedent(
        f"""
        import json, sys
        import numpy as np
        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer({out!r}, device="cpu")
        text = {LONG_TEXT!r}
        tokens = len(model.tokenizer(text)["input_ids"])
        length = model.max_seq_length
        full = model.encode([text])
        model.max_seq_length = 32
        first_32 = model.encode([text])
        differs = not np.allclose(full, first_32, atol=1e-4)
        print(json.dumps({{"tokens": tokens, "length": length, "differs": differs}}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["tokens"] >= 200 and seen["length"] == 128
    assert seen["differs"], "a 200-token input was cut at the training length (32)"

    # After the run: the final metrics (corpus size, STS-B test) are added to the card.
    metrics = {"history": history, "corpus": {"kept": 17891}, "stsb_test": 58.25, "best_step": 10}
    assert finalize_export(out, config, metrics, command="python jobs/train_informin.py") is None
    readme = (tmp_path / "model" / "README.md").read_text()
    assert "17,891 sentences" in readme
    assert "STS-B test, exported | 58.25" in readme
    assert "sts-test" in readme.split("---")[1]
    assert "python jobs/train_informin.py" in readme


def test_export_length_is_the_base_models_unless_set(tmp_path):
    bert = SimpleNamespace(max_position_embeddings=512, model_type="bert", pad_token_id=0)
    roberta = SimpleNamespace(max_position_embeddings=514, model_type="roberta", pad_token_id=1)
    tokenizer = SimpleNamespace(model_max_length=512)
    unlimited = SimpleNamespace(model_max_length=int(1e30))
    plain = tmp_path / "plain"
    plain.mkdir()
    assert export_max_seq_length(str(plain), tokenizer, bert) == 512
    assert export_max_seq_length(str(plain), unlimited, roberta) == 512  # 514 - (1 + 1)
    assert export_max_seq_length(str(plain), unlimited, None) is None  # nothing says
    assert export_max_seq_length(str(plain), tokenizer, bert, override=64) == 64
    st = tmp_path / "st"
    st.mkdir()
    (st / "sentence_bert_config.json").write_text('{"max_seq_length": 256}')
    assert export_max_seq_length(str(st), tokenizer, bert) == 256  # the model's own choice
    small = SimpleNamespace(max_position_embeddings=128, model_type="bert", pad_token_id=0)
    assert export_max_seq_length(str(st), tokenizer, small) == 128  # never past positions


def test_packaged_default_model_card_names_the_hub_model_and_its_licence(minilm_path):
    front = base_model_card(minilm_path)
    assert front["license"] == "apache-2.0"
    info = card_info(load_config(TrainingConfig, None, []), command="python x.py")
    assert info.base_model == PACKAGED_MODEL_ID
    assert info.license == "apache-2.0" and info.language == ["en"]
    assert info.model_name == "InforMin-CL all-MiniLM-L6-v2"
    section = training_section(info)
    assert "InfoNCE (τ = 0.05) + λ = 0.1 × reconstruction" in section
    assert "β" not in section  # mlm_weight 0: no MLM term


def test_a_retrieval_choice_is_what_the_card_says_chose_with_sts_beside_it(tmp_path):
    from harness.tiny_run import tiny_beir_dir

    config = load_config(
        TrainingConfig,
        None,
        [f"eval.retrieval_dir={tiny_beir_dir(tmp_path / 'beir')}", "eval.select_by=retrieval:dev"],
    )
    history = [
        {"step": 0, "stsb_dev_spearman": 80.0, "retrieval_dev_ndcg_at_10": 30.0},
        {"step": 10, "stsb_dev_spearman": 82.0, "retrieval_dev_ndcg_at_10": 31.0},
        {"step": 20, "stsb_dev_spearman": 79.5, "retrieval_dev_ndcg_at_10": 35.0},
    ]
    for row in history:
        row["select_score"] = row["retrieval_dev_ndcg_at_10"]
    info = card_info(config, history=history, command="python x.py")
    assert info.best_step == 20  # the best nDCG@10, not the best STS-B dev (step 10)
    assert info.scores == {
        "STS-B dev, start (step 0)": 80.0,
        "STS-B dev, exported (step 20)": 79.5,
        "nDCG@10 on retrieval dev, start (step 0)": 30.0,
        "nDCG@10 on retrieval dev, exported (step 20)": 35.0,
    }
    section = training_section(info)
    assert "the best by nDCG@10 on retrieval dev (`eval.select_by=retrieval:dev`)" in section
    assert "eval.retrieval_dir" not in info.hyperparameters  # a path on this machine


def test_a_card_of_the_given_model_unchanged_says_so_instead_of_an_exported_step():
    from distributed_emb.selection import exported_evaluation

    config = load_config(TrainingConfig, None, [])
    history = [
        {"step": 0, "stsb_dev_spearman": 80.0, "select_score": 80.0},
        {"step": 10, "stsb_dev_spearman": 79.0, "select_score": 79.0},
    ]
    exported = exported_evaluation(history, "stsb_dev", start_is_candidate=True)
    info = card_info(config, metrics={"history": history, "best_step": 0, "exported": exported})
    section = training_section(info)
    assert (
        "- **Exported:** the given model unchanged — no trained step beat it on STS-B dev "
        "Spearman (best trained 79.00 at step 10 vs 80.00 at the start)"
    ) in section
    assert "Exported step" not in section
    trained = card_info(
        config, metrics={"history": history, "best_step": 10, "exported": "step 10"}
    )
    assert "- **Exported step:** 10, the best by STS-B dev Spearman" in training_section(trained)


def test_rounds_add_their_lines_to_the_cards_training_section_or_add_the_section(tmp_path):
    lines = ["regime: student — the first 3 of 6 layers of m; the export is the student, not "
             "the given model"]  # fmt: skip
    bullet = "- **Regime:** student — the first 3 of 6 layers of m; the export is the student"
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "README.md").write_text(f"# m\n\n{SECTION_TITLE}\n\n- **Method:** x\n")
    add_card_lines(ours, lines)
    text = (ours / "README.md").read_text()
    assert text.startswith(f"# m\n\n{SECTION_TITLE}\n\n{bullet}") and "- **Method:** x" in text
    theirs = tmp_path / "theirs"  # a given model's own card
    theirs.mkdir()
    (theirs / "README.md").write_text("# all-MiniLM-L6-v2\n\nIts own card.\n")
    add_card_lines(theirs, lines)
    assert (
        (theirs / "README.md")
        .read_text()
        .startswith(f"# all-MiniLM-L6-v2\n\nIts own card.\n\n{SECTION_TITLE}\n\n{bullet}")
    )
    bare = tmp_path / "bare"  # no card at all
    bare.mkdir()
    add_card_lines(bare, lines)
    assert (bare / "README.md").read_text().startswith(f"{SECTION_TITLE}\n\n{bullet}")


def test_mlm_term_and_hub_id_in_the_card():
    config = load_config(
        TrainingConfig, None, ["loss.mlm_weight=0.3", "export.hub_model_id=my-org/my-model"]
    )
    info = card_info(config)
    assert "β = 0.3 × MLM (p = 0.15)" in info.objective
    assert info.model_name == "my-model" and info.hub_model_id == "my-org/my-model"
    assert info.non_default == {"loss.mlm_weight": 0.3, "export.hub_model_id": "my-org/my-model"}


def test_push_to_hub_offline_fails_before_training(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ConfigError, match=r"export\.push_to_hub: the hub is off \(HF_HUB_OFFLINE=1"
    ):
        load_config(TrainingConfig, None, ["export.push_to_hub=true", "export.hub_model_id=org/m"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(ConfigError, match=r"export\.hub_model_id: must be set"):
        load_config(TrainingConfig, None, ["export.push_to_hub=true"])
    with pytest.raises(ConfigError, match=r"export\.hub_model_id: 'no slash'"):
        load_config(TrainingConfig, None, ["export.hub_model_id=no slash"])
    with pytest.raises(ConfigError, match=r"export\.max_seq_length"):
        load_config(TrainingConfig, None, ["export.max_seq_length=2"])
    config = load_config(
        TrainingConfig, None, ["export.push_to_hub=true", "export.hub_model_id=org/m"]
    )
    assert config.export.push_to_hub
