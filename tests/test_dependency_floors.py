"""pyproject.toml's dependency floors are the versions CI installs and tests.

CI's first leg installs with `-c .ci/floors.txt`, which pins every direct dependency to its
floor, so a floor that stops being true fails the suite; its second leg installs the newest
releases (no constraints) for the unit tests. These checks keep the files in step: a floor
raised in one and not the other, a dependency without a floor, or a pin of something that is
not a direct dependency all fail here, naming the package; so do a newest leg that lost its
tests or gained constraints, and a README whose test command is not CI's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
FLOORS = REPO / ".ci" / "floors.txt"
UNTESTED_EXTRAS = {"mteb"}  # an optional hand-off CI does not install (said in pyproject)


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python ≥ 3.11
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _floors_file() -> dict[str, Version]:
    pins = {}
    for number, line in enumerate(FLOORS.read_text().splitlines(), 1):
        line = line.split("#")[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        (spec,) = requirement.specifier  # one specifier, "=="
        assert spec.operator == "==", f"{FLOORS.name}:{number}: {line!r} is not a == pin"
        name = canonicalize_name(requirement.name)
        assert name not in pins, f"{FLOORS.name}:{number}: {name} pinned twice"
        pins[name] = Version(spec.version)
    return pins


def _pyproject_floors() -> dict[str, Version]:
    project = _project()
    groups = {"dependencies": project["dependencies"]}
    for extra, requirements in project["optional-dependencies"].items():
        if extra not in UNTESTED_EXTRAS:
            groups[f"optional-dependencies.{extra}"] = requirements
    floors: dict[str, Version] = {}
    for group, requirements in groups.items():
        for text in requirements:
            requirement = Requirement(text)
            name = canonicalize_name(requirement.name)
            lows = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
            assert len(lows) == 1, f"pyproject.toml {group}: {text!r} needs one >= floor"
            assert floors.setdefault(name, lows[0]) == lows[0], (
                f"pyproject.toml {group}: {name} floor {lows[0]}, elsewhere {floors[name]}"
            )
    return floors


def test_every_floor_is_pinned_in_the_ci_constraints_and_nothing_else():
    floors, pins = _pyproject_floors(), _floors_file()
    for name, floor in floors.items():
        assert name in pins, f"{FLOORS.name}: no pin for {name} (pyproject.toml floor {floor})"
        assert pins[name] == floor, (
            f"{name}: pyproject.toml floor {floor}, {FLOORS.name} pins {pins[name]}"
        )
    assert set(pins) == set(floors), f"not direct dependencies: {sorted(set(pins) - set(floors))}"


def test_ci_installs_with_the_floors_and_torch_at_its_floor():
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r'pip install -q --no-compile -e "\.\[dev\]" -c \.ci/floors\.txt', ci)
    torch = _floors_file()["torch"]
    # CI and the README install torch first (a CPU build where one is on the index), at the floor.
    assert f"pip install -q --no-compile torch=={torch}" in ci
    assert f"pip install torch=={torch}" in (REPO / "README.md").read_text()


def test_the_readme_test_command_is_the_floors_leg():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    # Both run the suite in its two lanes (tests/harness/lanes.py).
    assert 'pip install -e ".[dev]" -c .ci/floors.txt && python -m pytest -n 2 -q' in readme
    assert "python -m pytest -n 2 -q -p no:cacheprovider --durations=25" in ci


def test_the_newest_leg_installs_unconstrained_and_its_tests_exist():
    ci = (REPO / ".ci" / "run").read_text()
    # The floors leg, then the newest leg: the same extras, the second without constraints.
    installs = re.findall(r'pip install -q --no-compile -e "\.\[dev\]".*$', ci, flags=re.M)
    assert installs == [
        'pip install -q --no-compile -e ".[dev]" -c .ci/floors.txt',
        'pip install -q --no-compile -e ".[dev]"',
    ]
    [block] = re.findall(r"NEWEST_TESTS=\((.*?)\)", ci, flags=re.DOTALL)
    paths = block.split()
    assert paths, "the newest leg runs no tests"
    missing = [path for path in paths if not (REPO / path).exists()]
    assert not missing, f".ci/run NEWEST_TESTS: no such test path {missing}"
    assert '-m "not slow" "${NEWEST_SKIPS[@]}" "${NEWEST_TESTS[@]}"' in ci
    # A --deselect that names no test deselects nothing, silently: each must name a test.
    skipped = re.findall(r'--deselect "([^"]+)"', ci)
    assert skipped, "NEWEST_SKIPS deselects nothing"
    for node in skipped:
        path, name = node.split("::")
        assert path in paths or path.rsplit("/", 1)[0] in paths, node
        assert f"def {name.split('[')[0]}(" in (REPO / path).read_text(), node
