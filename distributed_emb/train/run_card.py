"""What the exported model's card says about the training run that made it: the run's config,
evaluations and final metrics → model/model_card.py's `ModelCardInfo`, which that module renders.
On the driver (train/driver.py), the one place that holds the whole training config."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

from distributed_emb.config import TrainingConfig, to_dict
from distributed_emb.data.sources import is_hub_name, is_remote
from distributed_emb.evaluation.eval_config import validate_selection
from distributed_emb.evaluation.yardsticks import yardstick_lines
from distributed_emb.losses.terms import weighted_terms
from distributed_emb.model.model_card import (
    PACKAGED_MODEL_ID,
    ModelCardInfo,
    add_card_lines,
    add_eval_results,
    base_model_card,
    push_export,
    replace_card,
    write_readme,
)
from distributed_emb.selection import (
    AUTO,
    DEV_METRIC,
    DOCUMENTS,
    STSB_DEV,
    best_row,
    describe,
    documents_metric,
    selected_metric,
)
from distributed_emb.settings import flatten


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
    """What the run trained on, and each term it trained with (losses/terms.py): what the term
    does and where it comes from; a term of weight 0 is not named."""
    if config.data.kind == "pairs":
        views = "(anchor, positive) pairs"
    else:
        views = "two dropout views of each sentence (unsupervised)"
    terms = [
        f"{term.name}, {term.description} [{term.citation}]" for term in weighted_terms(config.loss)
    ]
    return f"Trained on {views} with " + "; ".join(terms)


def _objective(config: TrainingConfig) -> str:
    """The weighted sum the run minimised, the terms of weight > 0 only (losses/terms.py):
    "α = 1 × InfoNCE (τ = 0.05) + λ = 0.1 × reconstruction ‖z¹ − z²‖² (normalized_mse); …"."""
    lo = config.loss
    terms = weighted_terms(lo)
    weighted = " + ".join(
        f"{term.symbol} = {term.weight(lo):g} × {term.name} ({term.settings(lo)})" for term in terms
    )
    return "; ".join([weighted, *(term.note(lo) for term in terms if term.note is not None)])


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
    # eval.select_by's default (auto) is resolved for the run: what auto gives this config is
    # its default, not a choice the user made.
    defaults["eval.select_by"] = validate_selection(
        dataclasses.replace(config.eval, select_by=AUTO), config.builds_documents()
    )
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
    if selected_metric(select_by) != DEV_METRIC:
        labels[selected_metric(select_by)] = describe(select_by)
    # Topic beside paraphrase: the held-out documents' dev split, whatever chose.
    labels.setdefault(documents_metric("dev"), describe(f"{DOCUMENTS}dev"))
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


def finalize_export(
    model_dir: str, config: TrainingConfig, metrics: dict, command: str | None = None
) -> str | None:
    """After the run: rewrite the export's card with the final metrics (corpus size, STS-B
    test, the serving backends), then push it to the hub if `export.push_to_hub`. Returns the
    hub URL, else None."""
    from sentence_transformers import SentenceTransformer  # startup

    model = SentenceTransformer(model_dir, device="cpu", local_files_only=True)
    info = card_info(config, metrics=metrics, command=command, max_seq_length=model.max_seq_length)
    model.model_card_data = replace_card(model, info)
    add_eval_results(model, info)
    write_readme(model, model_dir, info)
    if metrics.get("backends"):
        add_card_lines(model_dir, serving_lines(metrics["backends"]))
    if metrics.get("yardsticks"):  # paraphrase and topic, each against the given model
        lines = yardstick_lines(metrics["yardsticks"])
        add_card_lines(model_dir, [*lines, *(metrics.get("yardstick_warnings") or [])])
    if config.export.push_to_hub:
        return push_export(model_dir, config.export.hub_model_id)
    return None


def serving_lines(backends: dict) -> list[str]:
    """The card's lines on export.backends: which modules the ONNX graph holds (a head is
    never dropped silently) and how each variant embeds against the torch model."""
    lines = [f"ONNX graph (onnx/): {' → '.join(backends['modules'])}"]
    torch_spearman = backends["torch"]["stsb_dev_spearman"]
    for name, result in backends.items():
        if name.startswith("onnx_"):
            variant = name.removeprefix("onnx_")
            lines.append(
                f"ONNX {variant} ({result['file']}): cosine with the torch model "
                f"{result['cosine_to_torch_mean']:.4f} (worst {result['cosine_to_torch_min']:.4f}),"
                f" STS-B dev {result['stsb_dev_spearman']:.2f} (torch {torch_spearman:.2f})"
            )
    return lines
