"""The suite's lanes under `pytest -n N` (harness/lanes.py): every module in one lane, the users
of the session's tiny run together, and the lanes balanced by the longest-first rule."""

from __future__ import annotations

from pathlib import Path

from harness.lanes import assign_lanes, module_of, recorded

TESTS = Path(__file__).resolve().parent


def test_a_module_stays_whole_and_the_longest_go_first():
    modules = ["a/test_one.py", "a/test_one.py", "b/test_two.py", "c/test_three.py",
               "d/test_four.py"]  # fmt: skip
    known = {
        "seconds": {
            "a/test_one.py": 100.0,
            "b/test_two.py": 60.0,
            "c/test_three.py": 50.0,
            "d/test_four.py": 20.0,
        },  # fmt: skip
        "fixtures": {},
    }
    # 100 + 20 against 60 + 50
    assert assign_lanes(modules, 2, known) == {
        "a/test_one.py": 0, "b/test_two.py": 1, "c/test_three.py": 1, "d/test_four.py": 0,
    }  # fmt: skip


def test_the_tiny_runs_users_share_a_lane_and_unknown_modules_cost_the_default():
    modules = ["train/test_x.py", "model/test_y.py", "losses/test_z.py", "data/test_w.py"]
    known = {
        "seconds": {"train/test_x.py": 10.0, "model/test_y.py": 10.0, "losses/test_z.py": 15.0},
        "fixtures": {"tiny_run": ["model/test_y.py", "train/test_x.py"]},
    }
    lanes = assign_lanes(modules, 2, known)
    assert lanes["train/test_x.py"] == lanes["model/test_y.py"] == 0  # 20 s, first
    assert lanes["losses/test_z.py"] == 1
    assert lanes["data/test_w.py"] == 1  # 5 s by default: 15 + 5 against 20


def test_a_test_id_names_its_module():
    assert module_of("tests/train/test_x.py::test_y[a::b]") == "train/test_x.py"
    assert module_of("tests/test_config.py::TestA::test_b") == "test_config.py"


def test_the_recorded_times_name_real_modules():
    known = recorded()
    named = set(known["seconds"]).union(*map(set, known["fixtures"].values()))
    missing = sorted(module for module in named if not (TESTS / module).is_file())
    assert not missing, f"harness/module_seconds.json names modules that are gone: {missing}"
