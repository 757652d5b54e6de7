"""One CLI contract for every job in jobs/ (each file there that declares a `JOB`, so a new job
is covered without being listed here): its --help names only flags and config keys the job
accepts, and its own example and --output pass the job's config check. In this process, through
the config and its checks only: no Ray is started, nothing is trained."""

from __future__ import annotations

import contextlib
import functools
import io
import re
from pathlib import Path

import pytest
import yaml
from harness.jobs import REPO, checked_config, job_module, run

from distributed_emb.cli import input_failure, job_config

JOBS = sorted(
    path.stem
    for path in (REPO / "jobs").glob("*.py")
    if re.search(r"^JOB\s*=", path.read_text(), re.MULTILINE)
)
UNKNOWN = "unknown config key"


@functools.cache
def help_text(name: str) -> str:
    """`python jobs/<name>.py --help`, as printed (argparse exits 0 after printing it)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        run(name, ["--help"])
    assert exit_.value.code == 0
    return out.getvalue()


def _section(text: str, title: str) -> list[str]:
    """The lines of one of argparse's sections ("options:"), up to the blank line ending it."""
    lines = text.splitlines()
    start = lines.index(title) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def named_flags(text: str) -> dict[str, bool]:
    """Each option the help names → whether it takes a value (a metavar follows it)."""
    flags = {}
    for line in _section(text, "options:"):
        match = re.match(r"  (-\S.*?)(?:\s{2,}|$)", line)
        if match:  # "  --output OUTPUT   help", "  -h, --help   help"
            for invocation in match.group(1).split(", "):
                name, *metavar = invocation.split()
                flags[name] = bool(metavar)
    return flags


def named_positionals(text: str) -> list[str]:
    return [
        match.group(1)
        for line in _section(text, "positional arguments:")
        if (match := re.match(r"  (\w+)", line))
    ]


def named_keys(text: str) -> dict[str, str]:
    """Each configuration key the help lists → the default it shows, as a key=value override
    writes it (YAML; a text value as the text itself: an override of a text key is taken as
    written)."""
    keys = {}
    for line in text.split("configuration keys", 1)[1].splitlines():
        match = re.match(r"  ([\w.]+) = (.*?)(?:  \(from .*)?$", line)
        if match:
            shown = match.group(2)
            value = yaml.safe_load(shown)
            keys[match.group(1)] = value if isinstance(value, str) else shown
    return keys


def example(text: str) -> str:
    found = re.search(r"e\.g\. (\S+=\S+)", " ".join(text.split()))
    assert found, "the help gives no key=value example"
    return found.group(1)


def refusal(check, name: str, argv: list[str]) -> str | None:
    """None if the job takes `argv`, else why not: a usage error (argparse exits), or the one
    line the job's error boundary would print. A bug is raised."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            check(name, argv)
    except SystemExit as error:
        return f"usage error (exit {error.code}): {stderr.getvalue().strip()}"
    except Exception as error:  # noqa: BLE001 - sorted as run_job sorts it
        message = input_failure(error)
        if message is None:
            raise
        return message
    return None


def config_only(name: str, argv: list[str]):
    """The job's config from `argv` (parsed, loaded, validated), without the job's checks."""
    return job_config(job_module(name).JOB, argv)


def assert_accepted(why: str | None, argv: list[str]) -> None:
    """Refused only for what the value is (a path that is not there, a required input), never
    as a flag or key the job does not have."""
    assert why is None or not (why.startswith("usage error") or UNKNOWN in why), (argv, why)


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """Relative paths (output directories) resolve under the test's own directory."""
    monkeypatch.chdir(tmp_path)


def test_every_job_is_found():
    assert {"train_informin", "evaluate", "embed", "search", "export_onnx"} <= set(JOBS)


@pytest.mark.parametrize("name", JOBS)
def test_help_names_its_keys_and_an_example_of_its_own(name):
    text = help_text(name)
    keys = named_keys(text)
    assert keys, "--help lists no configuration key"
    assert example(text).split("=", 1)[0] in keys
    assert "overrides" in named_positionals(text)


@pytest.mark.parametrize("name", JOBS)
def test_every_flag_the_help_names_is_accepted(name):
    text = help_text(name)
    flags = {
        flag: takes for flag, takes in named_flags(text).items() if flag not in ("-h", "--help")
    }
    assert "--print-config" in flags
    for flag, takes_value in flags.items():
        # "1" passes every type a flag parses with (int, float, a comma list, a path).
        argv = [flag, "1"] if takes_value else [flag]
        assert_accepted(refusal(config_only, name, argv), argv)
    for positional in named_positionals(text):
        if positional != "overrides":
            assert_accepted(refusal(config_only, name, ["1"]), [positional])


@pytest.mark.parametrize("name", JOBS)
def test_every_key_the_help_names_is_accepted(name):
    """Every listed key at the default the help shows, in one go: taken, or refused only as the
    job without them is (an input it requires: validated after every key is built); else each
    key alone."""
    overrides = [f"{key}={shown}" for key, shown in named_keys(help_text(name)).items()]
    why = refusal(config_only, name, overrides)
    if why is None or why == refusal(config_only, name, []):
        return
    for override in overrides:
        assert_accepted(refusal(config_only, name, [override]), [override])


@pytest.mark.parametrize("name", JOBS)
def test_the_help_example_and_output_pass_the_config_check(name, tmp_path):
    """The help's own example, and --output where offered, through the job's config and its
    checks: refused, if at all, only as the job without them is (an input it requires)."""
    text = help_text(name)
    given = [[example(text)]]
    if "--output" in named_flags(text):
        given.append(["--output", str(tmp_path / "new" / "out")])
    for argv in given:
        why = refusal(checked_config, name, argv)
        assert_accepted(why, argv)
        if why is not None:
            assert why == refusal(checked_config, name, []), argv


def test_a_job_whose_config_has_no_output_key_offers_no_output():
    """--output is offered from the declaration: a config class without the key gets none."""
    from dataclasses import replace

    from distributed_emb.cli import job_parser

    job = job_module("search").JOB
    assert "--output" in named_flags(job_parser(job).format_help())
    without = replace(job, output_key="no_such.key")
    assert "--output" not in named_flags(job_parser(without).format_help())
    assert "--output" not in named_flags(job_parser(replace(job, output_key=None)).format_help())


def test_export_onnx_output_exports_a_copy(tmp_path):
    """export_onnx --output OUT: MODEL_DIR is copied to OUT (its own onnx/ folder left out)
    and the export writes there; a non-empty OUT or one inside MODEL_DIR is refused."""
    model = tmp_path / "model"
    (model / "onnx").mkdir(parents=True)
    for file in ("modules.json", "config.json"):
        (model / file).write_text("{}")
    (model / "onnx" / "export.json").write_text("{}")
    config = checked_config("export_onnx", [str(model), "--output", "copy"])
    assert config.output.dir == "copy"
    assert job_module("export_onnx").export_dir(config) == "copy"
    assert sorted(p.name for p in Path("copy").iterdir()) == ["config.json", "modules.json"]
    assert (model / "onnx" / "export.json").is_file()

    assert "not an empty directory" in refusal(
        checked_config, "export_onnx", [str(model), "--output", "copy"]
    )
    inside = [str(model), "--output", str(model / "sub")]
    assert "inside model.path" in refusal(checked_config, "export_onnx", inside)
    # Without --output the export writes into MODEL_DIR itself (its onnx/ folder).
    assert job_module("export_onnx").export_dir(config_only("export_onnx", [str(model)])) == str(
        model
    )
