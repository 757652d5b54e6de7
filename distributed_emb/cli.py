"""The one way into every job: `run_job(Job(...))` parses the command line, loads and validates
the config, runs the job's checks before Ray starts, sets up logging, joins or starts Ray and runs
the job, and owns how failures reach the user (one line naming the key, path or file, exit
status 2) — a file in jobs/ declares only what is its own. Also `--help`'s key listing."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import json
import logging
import re
import sys
import textwrap
import tokenize
import traceback
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from distributed_emb.config import ConfigError, load_config, lookup, to_dict
from distributed_emb.errors import UserInputError
from distributed_emb.runtime import LOG_FORMAT, setup_logging, start_ray

log = logging.getLogger("distributed_emb")

EXIT_USAGE = 2  # bad input: a setting, path, file, bucket or model directory (argparse's too)


@dataclass(frozen=True)
class Flag:
    """A job's own command-line flag: its text sets config keys as given, never YAML-parsed,
    after the key=value overrides (so the flag wins). `key` for one key; `to_values` for a flag
    that sets several; `const` for a switch."""

    name: str  # "--senteval-data", or a positional name ("model")
    help: str
    key: str | None = None
    to_values: Callable[[Any], dict[str, Any]] | None = None
    nargs: str | None = None
    type: Callable[[str], Any] | None = None
    const: Any = None  # a switch: sets `key` to this when given

    def values(self, given: Any) -> dict[str, Any]:
        if self.to_values is not None:
            return self.to_values(given)
        return {self.key: self.const if self.const is not None else given}


def _nothing(config: Any) -> None:
    return None


def _always(config: Any) -> bool:
    return True


def _output_dir(config: Any) -> str | None:
    output = getattr(config, "output", None)
    return getattr(output, "dir", None)


@dataclass(frozen=True)
class Job:
    """What a file in jobs/ declares; run_job does the rest."""

    description: str
    config_class: type
    default_config: Path | None
    run: Callable[[Any], int]  # the job's work, once Ray is up where `uses_ray` says
    # Before --print-config: make the config what every process sees (absolute paths).
    prepare: Callable[[Any], None] = _nothing
    # After it, before Ray starts: checks that need files (an earlier run, a corpus, task data).
    check: Callable[[Any], None] = _nothing
    uses_ray: Callable[[Any], bool] = _always
    state_api: bool = False  # a local Ray serves its State API (Tune: cleaning stopped trials)
    flags: Sequence[Flag] = field(default_factory=tuple)
    # --resume / --resume-anyway / --overwrite: what to do with an earlier run (output.resume).
    earlier_run_flags: bool = False
    # --plan: start or join Ray, print the resource plan and exit with what this returns.
    plan: Callable[[Any], int] | None = None
    # Where run.log goes (None: the console only).
    log_dir: Callable[[Any], str | None] = _output_dir
    # The key --output sets (a directory in every job but evaluate's, where it is a file).
    output_key: str = "output.dir"
    # The config file and override words from the parsed arguments (a job that resumes from a
    # config it saved replaces this); ConfigError for a combination it refuses.
    config_source: Callable[[argparse.Namespace, Job], tuple[str | None, list[str]]] | None = None


def run_job(job: Job, argv: list[str] | None = None) -> int:
    """The one path every job runs: parse, load and validate, check, log, Ray, run. Returns the
    exit status; failures that come from what the user gave are one line and status 2."""
    parser = job_parser(job)
    args = parser.parse_intermixed_args(argv)
    try:
        config = job_config(job, args)
        if args.print_config:
            print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
            return 0
        job.check(config)
        if job.plan is not None and args.plan:
            logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT, force=True)
            start_ray(config.ray)
            return job.plan(config)
        setup_logging(job.log_dir(config))
        if job.uses_ray(config):
            start_ray(config.ray, state_api=job.state_api)
        return job.run(config)
    except Exception as error:  # noqa: BLE001 - the boundary: sorted below, bugs re-raised
        message = input_failure(error)
        if message is None:
            raise
        _keep_traceback_in_run_log(error)
        prefix = "config error" if isinstance(error, ConfigError) else "error"
        print(f"{prefix}: {message}", file=sys.stderr)
        return EXIT_USAGE


def job_config(job: Job, args: argparse.Namespace | list[str]) -> Any:
    """The job's validated, prepared config from its parsed arguments (or its argv): the config
    file, then key=value overrides, then the flags. Raises ConfigError naming the key."""
    if not isinstance(args, argparse.Namespace):
        args = job_parser(job).parse_intermixed_args(args)
    if job.config_source is not None:
        config_file, overrides = job.config_source(args, job)
    else:
        config_file, overrides = args.config, list(args.overrides)
    values: dict[str, Any] = {}
    if args.output is not None:
        # The flag's text is the path, whatever it looks like ("/runs/x #1", "2024").
        values[job.output_key] = args.output
    if job.earlier_run_flags and args.resume is not None:
        values["output.resume"] = args.resume
    for flag in job.flags:
        given = getattr(args, _dest(flag))
        if given is not None and given is not False:
            values.update(flag.values(given))
    config = load_config(job.config_class, config_file, overrides, values=values)
    job.prepare(config)
    return config


def _dest(flag: Flag) -> str:
    return flag.name.lstrip("-").replace("-", "_")


def job_parser(job: Job) -> argparse.ArgumentParser:
    default = job.default_config
    parser = argparse.ArgumentParser(
        description=job.description,
        epilog=config_keys_help(
            job.config_class, _default_tree(default), Path(default).name if default else ""
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved configuration as YAML (defaults, file, overrides) and exit",
    )
    if job.plan is not None:
        parser.add_argument(
            "--plan",
            action="store_true",
            help="connect to Ray (or start it locally), print the resource plan and exit: "
            "0 if the job fits the cluster, 3 if it never can (docs/OPERATIONS.md)",
        )
    parser.add_argument(
        "--config",
        help="YAML config (default: %(default)s)",
        default=str(default) if default else None,
    )
    parser.add_argument("--output", help=f"where the job writes (sets {job.output_key})")
    if job.earlier_run_flags:
        # What to do with an earlier run under the same run name (output.resume).
        earlier = parser.add_mutually_exclusive_group()
        for name, const, meaning in (
            ("--resume", "must", "continue the earlier run from its last checkpoint"),
            ("--resume-anyway", "anyway", "continue it even with different settings"),
            ("--overwrite", "overwrite", "delete the earlier run and start again"),
        ):
            earlier.add_argument(
                name, dest="resume", action="store_const", const=const,
                help=f"{meaning} (output.resume={const})",
            )  # fmt: skip
    for flag in job.flags:
        if flag.const is not None:
            parser.add_argument(flag.name, action="store_true", help=flag.help)
        elif flag.name.startswith("-"):
            parser.add_argument(flag.name, nargs=flag.nargs, type=flag.type, help=flag.help)
        else:
            parser.add_argument(flag.name, nargs="?", help=flag.help)
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.seed=1")
    return parser


# ---------------------------------------------------------------------------------------------
# The error boundary
# ---------------------------------------------------------------------------------------------


def input_failure(error: BaseException) -> str | None:
    """One line for a failure that comes from what the user gave, or None for a bug.

    What the user gave: the product's UserInputError (a setting, corpus, SentEval data, token
    cache), and the file system, object storage or hub refusing a path (OSError: missing, not
    a directory, no permission, no such bucket), or a file that is not what its name says
    (pyarrow's or json's parse errors). Ray raises a task's error as a class that is both
    RayTaskError and the original, and Ray Train wraps a worker's in WorkerGroupError: both are
    looked through to the cause."""
    for cause in _causes(error):
        if _wraps_a_cause(cause):
            continue  # Ray's dual class: its text is Ray's traceback; the cause follows
        if isinstance(cause, UserInputError):
            # Ray Data appends its retry advice to a task's error: the user's line is first.
            return str(cause).strip().splitlines()[0] if cause is not error else str(cause)
        if isinstance(cause, OSError):
            return _os_error_line(cause)
        if isinstance(cause, json.JSONDecodeError):
            return f"not valid JSON ({cause.msg} at line {cause.lineno})"
        if _is_unreadable_file(cause):
            return str(cause).strip()
    return None


def _wraps_a_cause(error: BaseException) -> bool:
    return isinstance(getattr(error, "cause", None), BaseException) and any(
        kind.__name__ == "RayTaskError" for kind in type(error).__mro__
    )


def _causes(error: BaseException) -> list[BaseException]:
    """`error`, then what it wraps (Ray's task and worker-group errors, explicit causes)."""
    seen: list[BaseException] = []
    pending = [error]
    while pending and len(seen) < 20:
        current = pending.pop(0)
        if any(current is s for s in seen):
            continue
        seen.append(current)
        pending.extend(getattr(current, "worker_failures", {}).values())
        for attribute in ("cause", "controller_failure", "__cause__"):
            inner = getattr(current, attribute, None)
            if isinstance(inner, BaseException):
                pending.append(inner)
    return seen


def _os_error_line(error: OSError) -> str:
    if isinstance(error, FileExistsError) and Path(str(error.filename)).is_file():
        return f"{error.filename}: is a file, not a directory"  # mkdir's "File exists"
    if error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return str(error).strip()


def _is_unreadable_file(error: BaseException) -> bool:
    """pyarrow's ArrowInvalid (a .parquet that is not Parquet, a bad JSON line) and the
    safetensors reader's error (a weights file that is not one), found by class so that this
    module imports neither."""
    kind = type(error)
    return (kind.__module__, kind.__name__) in {
        ("pyarrow.lib", "ArrowInvalid"),
        ("builtins", "SafetensorError"),
        ("safetensors_rust", "SafetensorError"),
    }


def _keep_traceback_in_run_log(error: BaseException) -> None:
    """The console gets one line; run.log (where logging writes one) keeps the traceback."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.stream.write("".join(traceback.format_exception(error)))
            handler.flush()


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
        found, value = lookup(file_tree or {}, key)
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


def _yaml_scalar(value: object) -> str:
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
