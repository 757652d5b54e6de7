"""Which run a checkpoint belongs to, and whether a new run may continue it.

Ray Train resumes any run it finds under `<storage>/<run name>`: it does not look at the
settings. Every checkpoint therefore carries a fingerprint of the settings that change what is
trained (`run_identity.json`, written by checkpointing.save_loop_state), and before training
starts the driver compares it with the new config (`prepare_run`): a run under the same name
with different settings is refused, naming the keys that differ.

What `output.resume` does with an existing run (same output.storage_path / output.run_name):
- "auto" (default): continue it when its settings match, refuse when they differ; refuse an
  output directory that already holds a finished run (metrics.json or model/).
- "must" (`--resume`): continue it; refuse when there is no checkpoint to continue or the
  settings differ. The output directory may hold the earlier results: they are rewritten.
- "anyway" (`--resume-anyway`): continue it even when the settings differ (logged).
- "overwrite" (`--overwrite`): delete the earlier run (its checkpoints in storage, model/ and
  metrics.json in the output directory) and start again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import shutil
from pathlib import Path

from pyarrow import fs as pafs

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, to_dict
from distributed_emb.data.training_stream import check_same_stream
from distributed_emb.settings import flatten
from distributed_emb.train.output_config import OutputConfig

log = logging.getLogger(__name__)

IDENTITY_FILE = "run_identity.json"
STATE_FILE = "trainer_state.json"  # the loop state, its data position and stream included
CONFIG_FILE = "training_config.json"  # the full config (checkpoints before run_identity.json)
CHECKPOINT_PREFIX = "checkpoint_"
RESULT_FILES = ("metrics.json", "model")
DEFAULT_RUN_NAME = "train"

# Keys that do not change what is trained (weights, optimizer, data order) nor which
# checkpoint is kept: where things are written, how Ray is reached, logging sinks, how many
# CPUs and threads do the same arithmetic, how often a checkpoint is written, failure budgets,
# and what happens after training (export, test). Changing one of them never makes a resumed
# run a different run. A prefix ending in "." covers a whole section.
IGNORED_KEYS = (
    "output.",
    "ray.",
    "logging.",
    "export.",
    "train.cpus_per_worker",
    "train.torch_threads",
    "train.max_failures",
    "train.report_steps",
    "train.deepspeed.trust_checkpoints",
    "train.data_cpus",  # where work runs, not what is computed
    # Resolved into num_workers and batch_size (which count) before the fingerprint is taken.
    "train.layout",
    "train.lower_cpus_to_fit",
    "train.stall_timeout_s",
    "train.elastic_resize_interval_s",
    "data.tokenize_batch_rows",
    "data.token_cache_dir",
    # Removed keys (config.py REMOVED_KEYS) that never changed the ids trained: ignored so a
    # checkpoint whose training_config.json still holds them is the same run.
    "data.tokenize_in",
    "data.token_cache",
    "eval.batch_size",
    "eval.test_after_training",
)

RESUME_FLAGS = {"must": "--resume", "anyway": "--resume-anyway", "overwrite": "--overwrite"}


class RunIdentityError(ConfigError):
    """An existing run or output directory conflicts with this one; the message says which
    keys or files, and the flag that resolves it."""


def _ignored(key: str) -> bool:
    return any(key.startswith(p) if p.endswith(".") else key == p for p in IGNORED_KEYS)


def identity(config_tree: dict) -> dict:
    """The settings that define a run: the flattened config without IGNORED_KEYS, with the
    global batch in place of how it is split (`train.num_workers` × `train.batch_size`): the
    batches trained are the same for any group size (data/epoch_plan.py), so a run resumed
    or resized onto another number of workers is the same run."""
    flat = flatten(config_tree)
    workers = flat.pop("train.num_workers", None)
    per_worker = flat.pop("train.batch_size", None)
    if workers is not None and per_worker is not None:
        most = workers[-1] if isinstance(workers, (list, tuple)) else workers
        flat["train.global_batch"] = most * per_worker
    return {k: v for k, v in sorted(flat.items()) if not _ignored(k)}


def fingerprint(config_tree: dict) -> str:
    """sha256 of the canonical JSON (sorted keys, no blanks) of `identity(config_tree)`."""
    canonical = json.dumps(identity(config_tree), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def identity_record(config_tree: dict) -> dict:
    """What a checkpoint stores: the fingerprint and the settings it covers (to name what
    differs)."""
    return {"fingerprint": fingerprint(config_tree), "settings": identity(config_tree)}


def differences(old: dict, new: dict) -> list[str]:
    """`key old → new` for every setting that differs (absent: a key one side lacks)."""
    changes = []
    for key in sorted(set(old) | set(new)):
        if key not in old or key not in new or old[key] != new[key]:
            changes.append(f"{key} {_shown(old, key)} → {_shown(new, key)}")
    return changes


def _shown(settings: dict, key: str) -> str:
    return json.dumps(settings[key]) if key in settings else "(absent)"


# ---------------------------------------------------------------------------------------------
# Storage: local paths and s3:// / gs:// through pyarrow, as Ray Train itself reaches them
# ---------------------------------------------------------------------------------------------


def run_location(output: OutputConfig, run_name: str):
    """(pyarrow filesystem, path of the run directory in it, the directory as shown to users)."""
    storage = output.storage_path or str(Path(output.dir) / "ray_results")
    if "://" in storage:
        filesystem, root = pafs.FileSystem.from_uri(storage)
        shown = f"{storage.rstrip('/')}/{run_name}"
    else:
        filesystem, root = pafs.LocalFileSystem(), os.path.abspath(storage)
        shown = os.path.join(root, run_name)
    return filesystem, posixpath.join(root, run_name), shown


def latest_checkpoint(filesystem, run_dir: str) -> str | None:
    """The newest complete `checkpoint_*` directory of a run (Ray names them
    checkpoint_<date_time.ms>, which sorts in time order), or None.

    Complete: it holds the run's identity (rank 0 writes it into every checkpoint). A newer
    directory without it is an upload that a lost node interrupted; Ray Train never registered
    it and resumes from the one before, so that is the one the new run is compared with. Where
    no directory holds an identity, the newest is returned (and the comparison names what it
    lacks)."""
    try:
        entries = filesystem.get_file_info(pafs.FileSelector(run_dir, allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        return None
    names = sorted(
        posixpath.basename(e.path)
        for e in entries
        if e.type == pafs.FileType.Directory
        and posixpath.basename(e.path).startswith(CHECKPOINT_PREFIX)
    )
    for name in reversed(names):
        directory = posixpath.join(run_dir, name)
        if any(
            filesystem.get_file_info(posixpath.join(directory, held)).type == pafs.FileType.File
            for held in (IDENTITY_FILE, CONFIG_FILE)
        ):
            if name != names[-1]:
                log.warning(
                    "%s: %s holds no run identity (an interrupted upload); comparing with %s",
                    run_dir, names[-1], name,
                )  # fmt: skip
            return directory
    return posixpath.join(run_dir, names[-1]) if names else None


def _read_json(filesystem, path: str) -> dict | None:
    if filesystem.get_file_info(path).type != pafs.FileType.File:
        return None
    with filesystem.open_input_stream(path) as stream:
        return json.loads(stream.read().decode())


def stored_identity(filesystem, checkpoint_dir: str) -> dict | None:
    """A checkpoint's identity record; for checkpoints written before run_identity.json
    existed, computed from the training_config.json beside it."""
    record = _read_json(filesystem, posixpath.join(checkpoint_dir, IDENTITY_FILE))
    if record is not None:
        return record
    config_tree = _read_json(filesystem, posixpath.join(checkpoint_dir, CONFIG_FILE))
    return identity_record(config_tree) if config_tree is not None else None


def check_resumed_stream(output: OutputConfig, run_name: str, stream: dict) -> None:
    """Refuse to resume a checkpoint whose data position indexes another stream than `stream`
    (data/training_stream.py TrainingStream.identity), naming what changed: a token cache
    built, rebuilt or removed, another corpus or cut. On the driver, before Ray Train starts."""
    filesystem, run_dir, _ = run_location(output, run_name)
    checkpoint = latest_checkpoint(filesystem, run_dir)
    if checkpoint is None:
        return
    state = _read_json(filesystem, posixpath.join(checkpoint, STATE_FILE)) or {}
    check_same_stream(state.get("stream"), stream, f"checkpoint {checkpoint}")


# ---------------------------------------------------------------------------------------------
# The check before training
# ---------------------------------------------------------------------------------------------


def resolve_run_name(config: TrainingConfig) -> str:
    """output.run_name; else "train" inside the output directory's own ray_results (one run
    per output directory, so an interrupted run resumes); else, on shared storage,
    `train-<the first 12 hex digits of the run's fingerprint>`: the same command with the same
    settings names the same run (a re-submission resumes it), other settings another run."""
    output = config.output
    if output.run_name:
        return output.run_name
    if output.storage_path is None:
        return DEFAULT_RUN_NAME
    return derived_run_name(to_dict(config))


def derived_run_name(config_tree: dict) -> str:
    return f"{DEFAULT_RUN_NAME}-{fingerprint(config_tree)[:12]}"


def prepare_run(config: TrainingConfig, dry_run: bool = False) -> str:
    """Check (and for "overwrite" clear) what an earlier run left; return the run name.

    Runs on the driver before the TorchTrainer is built: a conflict costs no training.
    `dry_run`: check only, delete nothing (the command line, before Ray starts).
    """
    mode = config.output.resume
    run_name = resolve_run_name(config)
    output = Path(config.output.dir)
    results = [name for name in RESULT_FILES if (output / name).exists()]
    filesystem, run_dir, shown = run_location(config.output, run_name)

    if mode == "overwrite":
        if not dry_run:
            _delete_earlier_run(filesystem, run_dir, shown, output, results)
        return run_name
    if results and mode == "auto":
        raise RunIdentityError(
            f"--output {output} already holds a run ({', '.join(results)}): pass --resume to "
            f"continue it from its last checkpoint, or --overwrite to delete it and start again "
            f"(output.resume=must / output.resume=overwrite)"
        )

    checkpoint = latest_checkpoint(filesystem, run_dir)
    if checkpoint is None:
        if mode == "must":
            raise RunIdentityError(
                f"output.resume=must (--resume): no checkpoint of run {run_name!r} in {shown} "
                f"to continue; drop --resume to start it, or check output.run_name and "
                f"output.storage_path"
            )
        if not dry_run and not config.output.run_name and config.output.storage_path:
            _say_how_it_differs(config, run_name)
        return run_name

    stored = stored_identity(filesystem, checkpoint)
    new = identity_record(to_dict(config))
    if stored is not None and stored["fingerprint"] == new["fingerprint"]:
        if not dry_run:
            log.warning("resuming run %r from %s", run_name, checkpoint)
        return run_name
    changes = (
        differences(stored.get("settings", {}), new["settings"])
        if stored is not None
        else [f"{CONFIG_FILE} and {IDENTITY_FILE} missing from {posixpath.basename(checkpoint)}"]
    )
    # A fingerprint mismatch with equal settings (an edited identity file): still different.
    changes = changes or ["fingerprint differs"]
    listed = ", ".join(changes)
    if mode == "anyway":
        if dry_run:
            return run_name
        log.warning(
            "output.resume=anyway: continuing run %r (%s) with different settings: %s",
            run_name,
            shown,
            listed,
        )
        return run_name
    raise RunIdentityError(
        f"output.run_name={run_name} already holds a run with different settings "
        f"(in {shown}): {listed}; pass --resume-anyway (output.resume=anyway) to continue it "
        f"with the new settings, --overwrite (output.resume=overwrite) to delete it, or choose "
        f"another output.run_name"
    )


def _say_how_it_differs(config: TrainingConfig, run_name: str) -> None:
    """A new run under a derived name (train-<fingerprint>) beside earlier derived runs on the
    same storage: name the keys in which it differs from the latest of them, so that a
    re-submission meant to resume, but with a setting changed, says so instead of starting
    over quietly."""
    storage = config.output.storage_path
    if "://" in storage:
        filesystem, root = pafs.FileSystem.from_uri(storage)
    else:
        filesystem, root = pafs.LocalFileSystem(), os.path.abspath(storage)
    try:
        entries = filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except OSError:
        return
    latest = []
    for entry in entries:
        name = posixpath.basename(entry.path)
        if entry.type == pafs.FileType.Directory and name.startswith(f"{DEFAULT_RUN_NAME}-"):
            checkpoint = latest_checkpoint(filesystem, entry.path)
            if checkpoint is not None and name != run_name:
                latest.append((posixpath.basename(checkpoint), name, checkpoint))
    if not latest:
        return
    _, name, checkpoint = max(latest)
    stored = stored_identity(filesystem, checkpoint)
    if stored is None:
        return
    changes = differences(stored.get("settings", {}), identity(to_dict(config)))
    log.warning(
        "starting run %r; the latest run on %s, %r, has other settings: %s (set "
        "output.run_name=%s to continue that one: --resume-anyway with the new settings)",
        run_name, storage, name, ", ".join(changes) or "fingerprint differs", name,
    )  # fmt: skip


def _delete_earlier_run(filesystem, run_dir: str, shown: str, output: Path, results) -> None:
    if filesystem.get_file_info(run_dir).type == pafs.FileType.Directory:
        log.warning("output.resume=overwrite: deleting the earlier run %s", shown)
        filesystem.delete_dir(run_dir)
    for name in results:
        path = output / name
        log.warning("output.resume=overwrite: deleting %s", path)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
