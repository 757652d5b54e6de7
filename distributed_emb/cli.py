"""The one way into every job: `run_job(Job(...))` parses the command line, loads and validates
the config, runs the job's checks before Ray starts, sets up logging, joins or starts Ray and runs
the job, and owns how failures reach the user (one line naming the key, path or file, exit
status 2) — a file in jobs/ declares only what is its own. Also `--help`'s key listing."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import textwrap
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from distributed_emb.checks import ConfigError
from distributed_emb.config import load_config, read_yaml, to_dict
from distributed_emb.errors import UserInputError
from distributed_emb.progress_report import set_progress
from distributed_emb.runtime import LOG_FORMAT, setup_logging, start_ray
from distributed_emb.settings import key_docs, lookup

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


def comma_list(text: str) -> list[str]:
    """A flag's "a, b,c" as ["a", "b", "c"] (a Flag's `type`): blanks and empty items dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


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
    # The key --output sets (a directory in most jobs, a file in evaluate's and search's).
    # --output is offered only where the config class declares this key (output_key_of).
    output_key: str | None = "output.dir"
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
        if getattr(config, "logging", None) is not None:
            set_progress(config.logging.progress_bar)  # every long piece of work, its workers'
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
    _overrides_given_as_positionals(job, args)
    if job.config_source is not None:
        config_file, overrides = job.config_source(args, job)
    else:
        config_file, overrides = args.config, list(args.overrides)
    values: dict[str, Any] = {}
    if getattr(args, "output", None) is not None:  # offered where the class declares the key
        # The flag's text is the path, whatever it looks like ("/runs/x #1", "2024").
        values[output_key_of(job)] = args.output
    if job.earlier_run_flags and args.resume is not None:
        values["output.resume"] = args.resume
    for flag in job.flags:
        given = getattr(args, _dest(flag))
        if given is not None and given is not False:
            values.update(flag.values(given))
    config = load_config(job.config_class, config_file, overrides, values=values)
    job.prepare(config)
    return config


def _overrides_given_as_positionals(job: Job, args: argparse.Namespace) -> None:
    """A positional left out (MODEL, OUT): argparse gave it the first key=value word, which is
    an override (`evaluate.py transfer.kfold=5`, `export_onnx.py onnx.opset=17 ...`). A path
    with "=" in its name that exists stays the positional."""
    for flag in reversed([f for f in job.flags if not f.name.startswith("-")]):
        given = getattr(args, _dest(flag))
        if isinstance(given, str) and "=" in given and not Path(given).exists():
            args.overrides = [given, *args.overrides]
            setattr(args, _dest(flag), None)


def _dest(flag: Flag) -> str:
    return flag.name.lstrip("-").replace("-", "_")


def output_key_of(job: Job) -> str | None:
    """The key `--output` sets, or None where the job's config class does not declare it: then
    the job offers no --output (its --help never names a flag the config would refuse)."""
    key = job.output_key
    return key if key is not None and key in key_docs(job.config_class) else None


def job_parser(job: Job) -> argparse.ArgumentParser:
    """The job's command line, and its --help, from its declaration alone: the Job's flags,
    --output where its config class declares job.output_key, and the class's keys (epilog)."""
    default = job.default_config
    file_tree = _default_tree(default)
    parser = argparse.ArgumentParser(
        description=job.description,
        epilog=config_keys_help(job.config_class, file_tree, Path(default).name if default else ""),
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
    output_key = output_key_of(job)
    if output_key is not None:
        meaning = key_docs(job.config_class)[output_key].help
        parser.add_argument("--output", help=f"{meaning} (sets {output_key})".replace("%", "%%"))
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
    example = example_override(job.config_class, file_tree)
    parser.add_argument(
        "overrides",
        nargs="*",
        help="key=value settings of the configuration keys listed below"
        + (f", e.g. {example}" if example else ""),
    )
    return parser


def example_override(cls: type, file_tree: dict | None = None) -> str | None:
    """A `key=value` the job accepts, for --help's example, from its declaration: its first
    numeric key at the value the job runs with by default (its YAML's, else the built-in), so
    the example is one of its own keys with a value every check accepts."""
    for doc in key_docs(cls).values():
        found, value = lookup(file_tree or {}, doc.key)
        value = value if found else doc.default
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return f"{doc.key}={_yaml_scalar(value)}"
    return None


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
# --help: every configuration key, its default, allowed values and meaning (its declaration)
# ---------------------------------------------------------------------------------------------


def config_keys_help(cls: type, file_tree: dict | None = None, file_name: str = "") -> str:
    """One entry per key of the config class `cls`, from its declaration (settings.py):
    `key = default`, then its meaning and allowed values. Where the job's default YAML
    (`file_tree`) sets a key, that is the default shown."""
    lines = ["configuration keys (set with key=value; default, then meaning):"]
    for doc in key_docs(cls).values():
        found, value = lookup(file_tree or {}, doc.key)
        shown = _yaml_scalar(value if found else doc.default)
        if found and value != doc.default:
            source = file_name or "the default config"
            shown += f"  (from {source}; built-in {_yaml_scalar(doc.default)})"
        lines.append(f"  {doc.key} = {shown}")
        allowed = doc.kinds + (f", {doc.bounds}" if doc.bounds else "")
        indent = " " * 6
        lines.extend(
            textwrap.wrap(
                f"{doc.help} [{allowed}]",
                96,
                initial_indent=indent,
                subsequent_indent=indent,
                break_on_hyphens=False,
            )
        )
    return "\n".join(lines)


def _default_tree(path: Path | str | None) -> dict:
    """The job's default YAML as a tree, read as the config is, for --help (empty if absent or
    unreadable: help never fails)."""
    if path is None or not Path(path).is_file():
        return {}
    try:
        tree = read_yaml(Path(path).read_text())
    except yaml.YAMLError:
        return {}
    return tree if isinstance(tree, dict) else {}


def _yaml_scalar(value: object) -> str:
    """`value` as YAML on one line (a mapping or list too: never wrapped mid-value)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=float("inf"))
    return text.removesuffix("\n...\n").strip()
