"""The encoder's settings (`model.*`), the prompt settings (`prompts.*`) and the prompt a
model puts before a query or a document, and the check that a model path is one, before Ray.

Prompts are sentence-transformers' own: a model's ``prompts`` dict and
``default_prompt_name`` (saved in config_sentence_transformers.json). :func:`role_prompt` is
the one place that decides which prompt a text gets, exactly as sentence-transformers 6.2's
``encode_query`` / ``encode_document`` / ``encode`` choose it; the torch path
(model/embedder.py) and the ONNX path (model/onnx_embedder.py) both prepend what it returns.
No torch here: the ONNX server and the config checks read it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from distributed_emb.checks import ConfigError
from distributed_emb.checks import require as _require
from distributed_emb.settings import section


@section
class ModelConfig:
    path: Annotated[
        str | None,
        Field(
            description="the encoder to start from: a Hugging Face or sentence-transformers "
            "directory (local or s3://), or a hub name; null: the packaged all-MiniLM-L6-v2"
        ),
    ] = None
    pooler: Annotated[
        Literal["cls", "cls_before_pooler", "mean"],
        Field(
            description="the sentence vector: mean of tokens, [CLS] through the pooler, or raw "
            "[CLS]"
        ),
    ] = "mean"
    mlp_head: Annotated[
        Literal["train_only", "export", "none"],
        Field(
            description="SimCSE's MLP (dense + tanh) over the pooled vector: during training "
            "only, also exported, or not at all"
        ),
    ] = "train_only"
    max_seq_length: Annotated[
        int, Field(ge=4, description="tokens per sentence in training (longer ones are cut)")
    ] = 32
    trust_remote_code: Annotated[
        bool, Field(description="allow a model directory's own Python code (custom models)")
    ] = False
    compression_head: Annotated[
        str | None,
        Field(
            description="an MCR² compression head (a models/mcr2-<dim> directory of "
            "jobs/train_mcr2.py) to fine-tune end to end with the encoder; the encoder's "
            "vectors pass through it in training, selection and the export"
        ),
    ] = None

    def local_path(self) -> str:
        """The encoder to start from, as a directory this process can open (a model on object
        storage is copied to the node once: storage.local_model_dir)."""
        from distributed_emb.paths import default_model_path
        from distributed_emb.storage import local_model_dir

        return local_model_dir(self.path or default_model_path())


# --- prompts ---------------------------------------------------------------------------------

Role = Literal["query", "document"]
ROLES: tuple[str, ...] = ("query", "document")
# The prompt names encode_document tries, in its order; encode_query tries "query" alone.
_ROLE_PROMPT_NAMES = {"query": ("query",), "document": ("document", "passage", "corpus")}
# What a SentenceTransformer holds before its saved prompts are read (its _default_prompts,
# None placeholders that become ""): "query" and "document" are always keys of model.prompts,
# so encode_query / encode_document never fall back to default_prompt_name on such a model.
_LOADED_PROMPT_KEYS = ("query", "document")
ST_CONFIG_FILE = "config_sentence_transformers.json"


@section
class PromptSettings:
    """The prompts put before queries and documents, one declaration for every job that
    embeds them (evaluation, embed, search): `prompts.query`, `prompts.document`."""

    query: Annotated[
        str | None,
        Field(
            description="text put before each query (BEIR evaluation, search); null: the "
            "model's own, as SentenceTransformer.encode_query (its 'query' prompt, else its "
            "default prompt); '': none (on a shell: \"prompts.query=''\")"
        ),
    ] = None
    document: Annotated[
        str | None,
        Field(
            description="text put before each document (BEIR corpus, embedded corpus rows); "
            "null: the model's own, as SentenceTransformer.encode_document (its 'document', "
            "'passage' or 'corpus' prompt, else its default prompt); '': none"
        ),
    ] = None

    def override(self, role: str | None) -> str | None:
        """The setting for `role` (None: the model's own; plain encoding has no setting)."""
        return {"query": self.query, "document": self.document}.get(role or "")


def role_prompt(
    prompts: Mapping[str, str | None], default_prompt_name: str | None, role: str | None
) -> str:
    """The text sentence-transformers 6.2 puts before a text embedded as `role` by a model with
    `prompts` and `default_prompt_name` ("" for none): "query" as ``encode_query`` (the
    "query" prompt when the model has that key), "document" as ``encode_document`` (the first
    of "document", "passage", "corpus" it has), else, and for `role` None (``encode``), the
    default prompt. `prompts` is the loaded model's dict (``model.prompts``, or
    :func:`loaded_prompts` of a saved config)."""
    if role is not None and role not in _ROLE_PROMPT_NAMES:
        raise ValueError(f"role must be one of {ROLES} or None, got {role!r}")
    for name in _ROLE_PROMPT_NAMES.get(role or "", ()):
        if name in prompts:
            return prompts[name] or ""
    if default_prompt_name is not None:
        return prompts.get(default_prompt_name) or ""
    return ""


def loaded_prompts(saved: Mapping[str, str | None] | None) -> dict[str, str]:
    """``model.prompts`` of a SentenceTransformer loaded from a directory whose config saved
    `saved`: its empty "query" and "document" placeholders, then the saved prompts."""
    prompts = dict.fromkeys(_LOADED_PROMPT_KEYS, "")
    prompts.update({name: text or "" for name, text in (saved or {}).items()})
    return prompts


def read_saved_prompts(path: str | None) -> tuple[dict[str, str], str | None]:
    """(``model.prompts``, ``default_prompt_name``) that loading the sentence-transformers
    model at `path` (a local directory, or a hub name already in the local cache) gives, from
    its config_sentence_transformers.json, without loading it; no config: no prompts."""
    config_file = None
    if path is not None and Path(path).is_dir():
        config_file = Path(path) / ST_CONFIG_FILE
    elif path is not None and looks_like_hub_name(path):
        try:
            from huggingface_hub import try_to_load_from_cache  # startup

            cached = try_to_load_from_cache(path, ST_CONFIG_FILE)
            config_file = Path(cached) if isinstance(cached, str) else None
        except Exception:  # no cache, or not a repository id: no saved prompts to read
            config_file = None
    if config_file is None or not config_file.is_file():
        return loaded_prompts(None), None
    try:
        saved = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{config_file} is not valid JSON ({error})") from None
    return loaded_prompts(saved.get("prompts")), saved.get("default_prompt_name")


def applied_prompts(
    path: str | None, pooler: str | None, settings: PromptSettings
) -> dict[str, str]:
    """{"query": text, "document": text} that embedding with the model at `path` puts before
    queries and documents: the settings, else the model's own (a sentence-transformers
    directory loaded as saved: `pooler` None); for the record (results, manifests)."""
    if pooler is None and path is not None and (Path(path) / "modules.json").is_file():
        prompts, default = read_saved_prompts(path)
    else:  # a plain encoder under our pooling: a model with no prompts
        prompts, default = loaded_prompts(None), None
    return {
        role: override if (override := settings.override(role)) is not None
        else role_prompt(prompts, default, role)
        for role in ROLES
    }  # fmt: skip


def looks_like_hub_name(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", text) is not None


def require_model_dir(path: str | None, key: str) -> None:
    """A model path must be a hub name ('org/model') or an existing model directory.

    Checked here, before Ray starts: a corpus file or an empty directory given as the model
    otherwise fails minutes later inside a Ray worker with a transformers traceback.
    """
    if path is None or "://" in path:  # on object storage: read where it is used
        return
    local = Path(path)
    if not local.exists():
        _require(
            looks_like_hub_name(path),
            key,
            f"{path!r} is not an existing directory (nor a hub name like 'org/model')",
        )
        return
    _require(
        local.is_dir(),
        key,
        f"{path} is a file, not a model directory (expected a directory with config.json, "
        "or modules.json for a sentence-transformers model)",
    )
    _require(
        (local / "config.json").is_file() or (local / "modules.json").is_file(),
        key,
        f"{path} is not a model directory: it has neither config.json (Hugging Face) "
        "nor modules.json (sentence-transformers)",
    )
    for name in ("config.json", "modules.json"):
        # Read by every worker that loads the model: a broken one fails here, not in them.
        if (local / name).is_file():
            try:
                json.loads((local / name).read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise ConfigError(f"{key}: {local / name} is not valid JSON ({error})") from None
