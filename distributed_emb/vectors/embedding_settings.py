"""What decides the content of an embedding output's shards, and the check that a run adds
only to shards made the same way.

OUT/embedding_settings.json is written before the first shard: the model (its location and a
digest of its files), how it pools and cuts sentences, the document prompt setting, the
precision, the backend (the torch model or an ONNX graph), the block size, the corpus's files
(paths and sizes) and how they are read. A later run into the same OUT compares its own
settings with it and refuses the first one that differs, naming its config key: a resumed run
must produce exactly the shards an uninterrupted one would have. No torch here: the job checks
this before Ray starts.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs

from distributed_emb.checks import ConfigError
from distributed_emb.data.corpus import corpus_path
from distributed_emb.data.sources import CorpusFiles, resolve_sources
from distributed_emb.errors import UserInputError
from distributed_emb.model.model_config import ModelConfig, require_model_dir
from distributed_emb.model.model_fingerprint import model_fingerprint
from distributed_emb.paths import default_model_path
from distributed_emb.storage import filesystem_of, is_remote, join
from distributed_emb.storage_paths import require_writable
from distributed_emb.vectors.embed_config import EmbedJobConfig
from distributed_emb.vectors.shard_writer import SETTINGS, finished_shards, read_json


class OutputMismatchError(UserInputError):
    """OUT holds shards made with other settings; names the setting and both values."""


# Each entry of the settings file → the config key the user changes.
SETTING_KEYS = {
    "model": "model.path",
    "model_files": "model.path",
    "pooler": "model.pooler",
    "rows_as": "embed.rows_as",
    "document_prompt": "prompts.document",
    "query_prompt": "prompts.query",
    "max_seq_length": "embed.max_seq_length",
    "normalize": "embed.normalize",
    "precision": "embed.precision",
    "backend": "embed.backend",
    "compute_dtype": "embed.compute_dtype",
    "calibration_rows": "embed.calibration_rows",
    "block_rows": "embed.block_rows",
    "write_text": "embed.write_text",
    "corpus": "data.path",
    "text_column": "data.text_column",
    "hf_split": "data.hf_split",
    "max_chars": "data.max_chars",
    "max_rows": "data.max_rows",
}


def model_location(model: ModelConfig) -> str:
    """The model to embed with: model.path (a local directory made absolute, a URI or hub name
    as given), or the packaged all-MiniLM-L6-v2."""
    location = model.path or default_model_path()
    if is_remote(location) or not Path(location).exists():
        return location
    return str(Path(location).resolve())


def saved_pooling(location: str, pooler: str) -> str | None:
    """The pooler to load `location` with: None (as saved: its own pooling, dense and
    normalise modules) for a sentence-transformers directory, else model.pooler over a plain
    Hugging Face encoder, as every other job loads a model (infocse/round_evaluation.py)."""
    if is_remote(location):
        filesystem, path = filesystem_of(join(location, "modules.json"))
        saved = filesystem.get_file_info(path).type == pafs.FileType.File
    else:
        saved = (Path(location) / "modules.json").is_file()  # model/sentence_transformer.py
    return None if saved else pooler


def embedding_settings(config: EmbedJobConfig, files: CorpusFiles) -> dict:
    """Everything that decides the content of OUT's shards (SETTING_KEYS)."""
    embed, data = config.embed, config.data
    location = model_location(config.model)
    return {
        "model": location,
        "model_files": model_fingerprint(location),
        "pooler": saved_pooling(location, config.model.pooler),
        # How rows are embedded: None for documents (as outputs from before the setting say),
        # and the prompt setting of that role (null: the model's own, its files decide).
        "rows_as": None if embed.rows_as == "document" else embed.rows_as,
        "document_prompt": config.prompts.document if embed.rows_as == "document" else None,
        "query_prompt": config.prompts.query if embed.rows_as == "query" else None,
        "max_seq_length": embed.max_seq_length,
        "normalize": embed.normalize,
        "precision": embed.precision,
        # None for torch (as outputs from before the setting say), else onnx or onnx_int8.
        "backend": None if embed.backend == "torch" else embed.backend,
        # As given ("auto" decides per actor, from its CPU); outputs from before the setting
        # were embedded in float32.
        "compute_dtype": embed.compute_dtype,
        "calibration_rows": embed.calibration_rows if embed.precision == "int8" else None,
        "block_rows": embed.block_rows,
        "write_text": embed.write_text,
        "corpus": [[f.path, f.size] for f in files.files],
        "text_column": data.text_column,
        "hf_split": data.hf_split,
        "max_chars": data.max_chars,
        "max_rows": data.max_rows,
    }


def require_same_settings(out: str, settings: dict) -> None:
    """Refuse to add to an OUT whose shards were made with other settings (OutputMismatchError
    naming the first key that differs); an OUT with shards but no settings file is refused
    too (not this job's output, or one from before it wrote settings)."""
    earlier = read_json(join(out, SETTINGS))
    if earlier is None:
        if finished_shards(out):
            raise OutputMismatchError(
                f"{out}: holds shards but no {SETTINGS}, so what made them is unknown; embed "
                "into another --output, or delete it to start over"
            )
        return
    advice = f"embed into another --output, or delete {out} to start over"
    for name, key in SETTING_KEYS.items():
        then, now = earlier.get(name), settings[name]
        if name == "compute_dtype" and name not in earlier:
            then = "float32"
        if then == now:
            continue
        if name == "backend":  # null is torch
            then, now = then or "torch", now or "torch"
        if name == "model_files":
            raise OutputMismatchError(
                f"{key}: the model at {settings['model']} has changed since {out} was embedded "
                f"with it (its files differ); {advice}"
            )
        if name == "corpus":
            raise OutputMismatchError(
                f"{key}: {out} holds embeddings of another corpus ({_corpus_change(then, now)}); "
                f"{advice}"
            )
        raise OutputMismatchError(
            f"{key}: {out} was embedded with {key}={_shown(then)}, this run has "
            f"{key}={_shown(now)}; {advice}"
        )


def _shown(value) -> str:
    """A setting's value as it is written in YAML."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _corpus_change(then: list, now: list) -> str:
    before, after = dict(map(tuple, then or [])), dict(map(tuple, now))
    if set(before) != set(after):
        gone = sorted(set(before) - set(after))
        new = sorted(set(after) - set(before))
        parts = [f"no longer listed: {', '.join(gone[:3])}"] if gone else []
        parts += [f"new: {', '.join(new[:3])}"] if new else []
        return "; ".join(parts)
    changed = next(path for path in sorted(after) if before[path] != after[path])
    return f"{changed} was {before[changed]} bytes, is {after[changed]}"


def check_embed_job(config: EmbedJobConfig) -> None:
    """Before Ray starts: the output is given and writable, the model is a model directory,
    the corpus is listed (a missing file or bucket fails here, named), and an existing OUT
    made with other settings is refused."""
    if config.embed.output_dir is None:
        raise ConfigError("embed.output_dir: is required (--output DIR)")
    require_writable(config.embed.output_dir, "embed.output_dir")
    require_model_dir(config.model.path, "model.path")
    files = resolve_sources(corpus_path(config.data), config.data.hf_split)
    require_same_settings(config.embed.output_dir, embedding_settings(config, files))
