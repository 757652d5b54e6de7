"""Shared command-line plumbing for the jobs: config parsing, logging, connecting to Ray."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import io
import json
import logging
import os
import re
import secrets
import socket
import sys
import textwrap
import tokenize
import typing
from collections.abc import Iterator
from pathlib import Path

import yaml

from distributed_emb.config import ConfigError, TrainingConfig, load_config, to_dict
from distributed_emb.data.corpus import check_small_corpus
from distributed_emb.data.sources import CorpusError
from distributed_emb.resource_plan import cluster_from_ray, training_plan
from distributed_emb.tracking import LOG_FORMAT, dedupe_repeated_ray_warnings, quiet_ray_data
from distributed_emb.train.run_identity import RunIdentityError, prepare_run

log = logging.getLogger("distributed_emb")

WORKER_SETUP_HOOK = "distributed_emb.tracking.quiet_worker_setup"


# Set in this process and passed to every Ray worker (start_ray) unless the user set them:
# - HF_HUB_OFFLINE: no hub access at run time unless the user opts in (HF_HUB_OFFLINE=0);
# - TOKENIZERS_PARALLELISM: one thread per tokenising process, which Ray already runs many of;
# - HF_HUB_DISABLE_PROGRESS_BARS: no "Loading weights" bar each time a Train worker, Tune
#   trial or annotation actor loads the model (transformers reads it at import);
# - RAY_DATA_PARQUET_FOOTER_NUM_ACTORS: Ray Data (2.60) lists the files of every read_parquet
#   (the token cache, data/token_cache.py) through a pool of footer-reading actors, 32 new
#   worker processes per read however few the files. A search's one-file token cache took 97 s
#   to list on a 2-core cluster while they started, against 3 s with 2; two actors, each with
#   Ray's 128 concurrent reads, still list thousands of object-store files in parallel.
ENVIRONMENT_DEFAULTS = {
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS": "2",
}


def environment_defaults() -> None:
    for name, value in ENVIRONMENT_DEFAULTS.items():
        os.environ.setdefault(name, value)


# At import, not in a job's main(): huggingface_hub and datasets read HF_HUB_OFFLINE once, when
# first imported, and a job's own imports (transformers, through the trainer) import them before
# main() runs; set later, the variable is there and the hub client still goes online. Every job
# imports this module before any of those, and this module's imports never reach them
# (tests/test_offline.py checks both).
environment_defaults()


def setup_logging(output_dir: str | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(Path(output_dir) / "run.log"))
    logging.basicConfig(
        level=logging.INFO,
        format=LOG_FORMAT,
        handlers=handlers,
        force=True,
    )
    dedupe_repeated_ray_warnings()


def parse_training_args(
    argv: list[str] | None, default_config: Path | None, description: str
) -> TrainingConfig:
    """`[--config YAML] [--output DIR] [key=value ...]` → a validated TrainingConfig.

    Invalid configuration exits with status 2 and the key's name, before Ray starts.
    """
    parser = argparse.ArgumentParser(
        description=description,
        epilog=config_keys_help(
            TrainingConfig,
            _default_tree(default_config),
            Path(default_config).name if default_config else "",
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved configuration as YAML (defaults, file, overrides) and exit",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="connect to Ray (or start it locally), print the resource plan and exit: "
        "0 if the job fits the cluster, 3 if it never can (docs/OPERATIONS.md)",
    )
    parser.add_argument(
        "--config",
        help="YAML config (default: %(default)s)",
        default=str(default_config) if default_config else None,
    )
    parser.add_argument("--output", help="output directory (sets output.dir)")
    # What to do with an earlier run under the same run name (output.resume, run_identity.py).
    earlier = parser.add_mutually_exclusive_group()
    earlier.add_argument(
        "--resume",
        dest="resume",
        action="store_const",
        const="must",
        help="continue the earlier run from its last checkpoint (output.resume=must)",
    )
    earlier.add_argument(
        "--resume-anyway",
        dest="resume",
        action="store_const",
        const="anyway",
        help="continue it even with different settings (output.resume=anyway)",
    )
    earlier.add_argument(
        "--overwrite",
        dest="resume",
        action="store_const",
        const="overwrite",
        help="delete the earlier run and start again (output.resume=overwrite)",
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. loss.temperature=0.05")
    args = parser.parse_args(argv)
    # The flag's text is the directory, whatever it looks like ("/runs/x #1", "2024"): set as
    # a value, never parsed, and after the overrides so the flag wins.
    values = {"output.dir": args.output} if args.output is not None else None
    if args.resume is not None:
        values = {**(values or {}), "output.resume": args.resume}
    try:
        config = load_config(TrainingConfig, args.config, args.overrides, values=values)
    except ConfigError as error:
        parser.exit(2, f"config error: {error}\n")
    # Before anything uses them: the run's identity is of the absolute paths.
    config.make_paths_absolute()
    if args.print_config:
        print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
        parser.exit(0)
    try:
        # Before Ray starts; run_training checks again (and, for --overwrite, deletes).
        prepare_run(config, dry_run=True)
    except RunIdentityError as error:
        parser.exit(2, f"error: {error}\n")
    try:
        check_small_corpus(config)  # a local corpus too small for one step, before Ray starts
    except CorpusError as error:
        parser.exit(2, f"corpus error: {error}\n")
    if args.plan:
        parser.exit(print_plan(config))
    setup_logging(config.output.dir)
    return config


def print_plan(config: TrainingConfig) -> int:
    """`--plan`: the resource plan of `config` on the cluster it would run on; the exit status
    (0: fits, now or once the autoscaler adds nodes; 3: can never fit)."""

    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT, force=True)
    start_ray(config)
    plan = training_plan(config, cluster_from_ray())
    print(plan.table())
    return 3 if plan.problem else 0


def start_ray(config: TrainingConfig, state_api: bool = False) -> None:
    """Join the cluster in RAY_ADDRESS / ray.address (e.g. under `ray job submit`), or start a
    local Ray with no cluster at all.

    `state_api`: a local instance also serves Ray's State API to its own workers (the dashboard,
    and the instance's address in every worker's RAY_ADDRESS). Ray Train frees the placement
    group of a run whose controller was killed (a Tune trial stopped early) through it; workers
    otherwise guess the address, which fails when the machine runs other Ray instances.
    """
    import ray  # startup

    # Before any dataset is built: the Data context travels with the dataset to its executor.
    quiet_ray_data()
    if ray.is_initialized():
        return
    address = config.ray.address or os.environ.get("RAY_ADDRESS")
    # Under `ray job submit` the job's runtime env (e.g. cluster/runtime_env.yaml) already
    # reaches every task, and Ray refuses to merge a driver runtime env that sets one of its
    # env vars again: pass on only the ones the job does not set.
    job_config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}"))
    job_env_vars = (job_config.get("runtime_env") or {}).get("env_vars") or {}
    runtime_env = {
        "env_vars": {
            k: os.environ[k]
            for k in (*ENVIRONMENT_DEFAULTS, "HF_HOME")
            if k in os.environ and k not in job_env_vars
        }
    }
    if "worker_process_setup_hook" not in (job_config.get("runtime_env") or {}):
        # Every worker process (Train workers, Ray Data executors, Ray Train's placement-group
        # cleaner) turns Data progress bars off and says a repeated Ray warning once.
        runtime_env["worker_process_setup_hook"] = WORKER_SETUP_HOOK
    if address:
        if address != "auto" and "://" not in address and "RAY_ADDRESS" not in job_env_vars:
            # Ray Train's placement-group cleaner asks the State API whether the run's
            # controller lives; without RAY_ADDRESS a worker guesses the cluster from the
            # machine's latest local Ray, and where the machine runs another Ray instance it
            # asks that one, is told "no such actor", and removes the live run's workers.
            runtime_env["env_vars"]["RAY_ADDRESS"] = address
        ray.init(address=address, runtime_env=runtime_env)
        return
    # The machine's own cores: the resource plan (resource_plan.py, run by run_training) leaves
    # Ray Data its share by lowering the Train workers' reservation where it must, so nothing
    # depends on logical CPUs above the core count (docs/ARCHITECTURE.md, "Ray on small machines").
    num_cpus = config.ray.num_cpus or os.cpu_count() or 1
    store = config.ray.object_store_memory_mb
    if state_api:
        port = _free_port()
        os.environ["RAY_GCS_SERVER_PORT"] = str(port)  # read by the local head at start
        runtime_env["env_vars"]["RAY_ADDRESS"] = f"{ray.util.get_node_ip_address()}:{port}"
    # Ray's GCS, raylet and worker gRPC ports listen on every interface whatever the node IP:
    # token auth is what refuses strangers, so it is set here, not left to Ray's default.
    require_local_token_auth()
    try:
        with local_instance_environment():
            ray.init(
                # A new instance of our own, never a `ray start` cluster that happens to run
                # on this machine (that one is joined only through RAY_ADDRESS / ray.address).
                address="local",
                num_cpus=num_cpus,
                include_dashboard=state_api,
                object_store_memory=store * 1024**2 if store else None,
                runtime_env=runtime_env,
            )
    finally:
        os.environ.pop("RAY_GCS_SERVER_PORT", None)


# Read by a local raylet when it starts, and inherited by every worker it spawns; an explicit
# value in the environment still wins, and `ray start` clusters keep Ray's own defaults.
# - RAY_worker_niceness: Ray starts its workers at nice 15, so on a machine doing anything else
#   a local run gets only the CPU left over, while the plain script a user compares it with
#   runs at 0. A local run is the user's foreground job: its workers run at the driver's.
# - RAY_TRAIN_ENABLE_PREEMPTION_WATCHER: Ray Train starts an actor per run that polls for spot
#   node preemption; one machine has no node to lose to a preemption, and the actor's start
#   costs each run seconds of a small machine's CPU.
LOCAL_INSTANCE_ENVIRONMENT = {
    "RAY_worker_niceness": "0",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}


@contextlib.contextmanager
def local_instance_environment() -> Iterator[None]:
    """LOCAL_INSTANCE_ENVIRONMENT's variables that are unset, set while a local Ray starts."""
    added = [name for name in LOCAL_INSTANCE_ENVIRONMENT if name not in os.environ]
    for name in added:
        os.environ[name] = LOCAL_INSTANCE_ENVIRONMENT[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def require_local_token_auth() -> None:
    """RAY_AUTH_MODE=token for a local Ray started by this process (unless the user set the
    variable), with a token only its owner can read.

    Ray 2.60 enables token auth for a new local ray.init by default and writes a missing
    ~/.ray/auth_token with the process umask (often world-readable); both are Ray's choices
    that may change, so the mode is set explicitly and the token file created 0600.
    """
    if "RAY_AUTH_MODE" not in os.environ:
        from ray._raylet import Config  # private

        os.environ["RAY_AUTH_MODE"] = "token"
        # Ray caches its config (the auth mode included) when imported: without a refresh this
        # driver would not send the token its own GCS then demands. Ray's own default-on path
        # (authentication_token_setup._enable_token_auth) makes the same call.
        Config.initialize("")
    mode = os.environ["RAY_AUTH_MODE"]
    if mode != "token":
        log.warning(
            "RAY_AUTH_MODE=%s: this local Ray accepts clients without a token on ports that "
            "listen on every interface (see docs/OPERATIONS.md, security model)",
            mode,
        )
        return
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return  # the user's own token
    token_file = Path.home() / ".ray" / "auth_token"
    if not token_file.exists():
        token_file.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(32))  # what `ray get-auth-token --generate` makes
    elif token_file.stat().st_mode & 0o077:
        log.warning("%s was readable by other users; made it private (0600)", token_file)
        token_file.chmod(0o600)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def training_job(argv: list[str] | None, default_config: Path, description: str) -> int:
    """A training job's main (jobs/train_informin.py, jobs/finetune_mcr2.py): parse and validate
    before Ray starts, join or start Ray, train with Ray Train, print the run's summary."""
    config = parse_training_args(argv, default_config, description)
    start_ray(config)
    from distributed_emb.train.trainer import run_training  # startup: torch, transformers

    result = run_training(config)
    print(summarise_run(result.metrics))
    return 0


def summarise_run(metrics: dict) -> str:
    def fmt(value, spec=".2f"):
        return "n/a" if value is None else format(value, spec)

    corpus = metrics.get("corpus") or {}
    return "\n".join(
        [
            f"model:            {metrics.get('model_dir')}",
            f"STS-B dev:        {fmt(metrics.get('stsb_dev_before'))} → "
            f"{fmt(metrics.get('stsb_dev_after'))} (best {fmt(metrics.get('stsb_dev_best'))} "
            f"at step {metrics.get('best_step')})",
            f"STS-B test:       {fmt(metrics.get('stsb_test'))} (exported model)",
            f"steps:            {metrics.get('steps')} × global batch "
            f"{metrics.get('global_batch')}",
            f"sentences/s:      {fmt(metrics.get('sentences_per_s'), '.1f')}",
            f"corpus:           kept {corpus.get('kept')}, dropped {corpus.get('dropped')}",
            f"wall time:        {fmt(metrics.get('wall_time_s'), '.0f')} s",
        ]
    )


# ---------------------------------------------------------------------------------------------
# --help: every configuration key, its default and its meaning
# ---------------------------------------------------------------------------------------------

# Meanings of keys whose field in config.py has no comment, or whose comment only explains one
# value ("None: ..."); shown before that comment. The comments in config.py stay the main
# source: a new field needs either (tests/test_config.py checks every key has a meaning).
KEY_HELP = {
    "model.path": "the encoder to start from: an HF or sentence-transformers dir, or hub name",
    "model.pooler": "sentence vector: mean of tokens, [CLS] through the pooler, or raw [CLS]",
    "model.max_seq_length": "tokens per sentence during training (longer ones are truncated)",
    "model.trust_remote_code": "allow a model directory's own Python code (custom models)",
    "data.path": "the training corpus: a file, directory, glob, s3:// or gs:// URL, or hub name",
    "data.text_column": "the text field of JSONL / Parquet / HF rows",
    "data.hf_split": "the split of a Hugging Face dataset",
    "data.anchor_column": "pairs: the anchor field",
    "data.positive_column": "pairs: the positive field",
    "data.group_column": "rows of one group (document) are not each other's negatives, and "
    "are one cluster of loss.mcr2",
    "data.shuffle_seed": "seed of the corpus shuffle",
    "loss.temperature": "τ of InfoNCE",
    "loss.mlm_probability": "share of tokens masked for the MLM term",
    "loss.mlm_weight": "weight of the masked-language-model term",
    "train.num_workers": "Ray Train workers (one per GPU), or [min, max] for an elastic group",
    "train.use_gpu": "one GPU per worker",
    "train.cpus_per_worker": "CPUs each worker reserves",
    "train.engine": "DDP, or DeepSpeed ZeRO (pip install -e '.[deepspeed]')",
    "train.precision": "training precision (fp16 only on GPUs)",
    "train.compile": "faster steps on GPUs, after minutes of compiling",
    "train.gradient_accumulation_steps": "batches per optimizer step",
    "train.learning_rate": "peak AdamW learning rate (linear decay)",
    "train.weight_decay": "AdamW weight decay",
    "train.warmup_ratio": "share of the steps with a linear warm-up",
    "train.max_grad_norm": "gradient clipping bound; null: no clipping",
    "train.epochs": "passes over the corpus",
    "train.seed": "seed of the model, dropout and data order",
    "train.torch_threads": "torch threads per worker",
    "train.report_steps": "also evaluate STS-B dev and checkpoint every N steps",
    "train.max_failures": "worker-group restarts from the last checkpoint before the run fails",
    "train.deepspeed.zero_stage": "DeepSpeed ZeRO stage",
    "eval.eval_steps": "evaluate STS-B dev (and checkpoint) every N steps",
    "eval.batch_size": "sentences per evaluation batch",
    "eval.senteval_dir": "SentEval data directory",
    "output.dir": "where model/, metrics.json, run.log and train_log.jsonl go",
    "output.checkpoints_to_keep": "Ray Train checkpoints kept (the best by STS-B dev)",
    "output.run_name": "Ray Train run name (also the trackers' run name)",
    "ray.address": "the Ray cluster to join",
    "ray.num_cpus": "logical CPUs of a local Ray instance",
    "ray.object_store_memory_mb": "object store of a local Ray instance",
}


def config_keys_help(cls: type, file_tree: dict | None = None, file_name: str = "") -> str:
    """One entry per key of the dataclass `cls`: `key = default`, then its meaning. Where the
    job's default YAML (`file_tree`) sets a key, that is the default shown."""
    lines = ["configuration keys (set with key=value; default, then meaning):"]
    for key, default, meaning in config_keys(cls):
        found, value = _lookup(file_tree or {}, key)
        shown = _yaml_scalar(value if found else default)
        if found and value != default:
            source = file_name or "the default config"
            shown += f"  (from {source}; built-in {_yaml_scalar(default)})"
        lines.append(f"  {key} = {shown}")
        indent = " " * 6
        lines.extend(textwrap.wrap(meaning, 96, initial_indent=indent, subsequent_indent=indent))
    return "\n".join(lines)


def config_keys(cls: type, prefix: str = "") -> list[tuple[str, object, str]]:
    """(dotted key, built-in default, meaning) for every leaf field of `cls`, in order."""
    hints = typing.get_type_hints(cls)
    comments = _field_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            rows.extend(config_keys(hints[f.name], key + "."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        meaning = "; ".join(filter(None, [KEY_HELP.get(key), comments.get(f.name)]))
        rows.append((key, default, meaning))
    return rows


def _field_comments(cls: type) -> dict[str, str]:
    """Field name → its comment in the class source: the trailing one on the field's line,
    after the block of comment lines right above it (joined into one line). Empty when the
    source cannot be read (e.g. a zipped install): --help then shows KEY_HELP only."""
    source = _class_source(cls)
    if source is None:
        return {}
    lines = source.splitlines()
    trailing: dict[int, str] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                row, col = token.start
                if lines[row - 1][:col].strip():  # code before it: a trailing comment
                    trailing[row] = token.string.lstrip("#").strip()
    except (tokenize.TokenError, IndentationError):
        return {}
    comments = {}
    for index, line in enumerate(lines):
        match = re.match(r"    ([A-Za-z_]\w*)\s*:", line)
        if match is None:
            continue
        above = []
        row = index - 1
        while row >= 0 and lines[row].strip().startswith("#"):
            above.insert(0, lines[row].strip().lstrip("#").strip())
            row -= 1
        parts = [" ".join(above), trailing.get(index + 1, "")]
        comments[match.group(1)] = "; ".join(p for p in parts if p)
    return comments


def _class_source(cls: type) -> str | None:
    """The dedented source of a top-level class, found by scanning its module's file. Not
    `inspect.getsource`: on Python 3.11 that runs `ast.parse`, whose recursion counter is shared
    between threads, so it fails at random ("AST constructor recursion depth mismatch") while a
    Ray background thread formats a traceback. None when the file cannot be read."""
    try:
        path = inspect.getsourcefile(cls)
        text = Path(path).read_text() if path else None
    except (OSError, TypeError):
        return None
    if text is None:
        return None
    lines = text.splitlines()
    header = re.compile(rf"class {re.escape(cls.__name__)}\b")
    starts = [row for row, line in enumerate(lines) if header.match(line)]
    if not starts:
        return None
    start = starts[0]
    end = start + 1
    # The body runs until the next line of code at column 0 (blank lines and comments inside
    # the class are part of it).
    while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t#"):
        end += 1
    return textwrap.dedent("\n".join(lines[start:end]).rstrip() + "\n")


def _default_tree(path: Path | str | None) -> dict:
    """The job's default YAML as a tree, for --help (empty if absent or unreadable: help never
    fails)."""
    if path is None or not Path(path).is_file():
        return {}
    try:
        tree = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError:
        return {}
    return tree if isinstance(tree, dict) else {}


def _lookup(tree: dict, dotted: str) -> tuple[bool, object]:
    node: object = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _yaml_scalar(value: object) -> str:
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
