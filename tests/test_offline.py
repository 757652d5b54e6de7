"""The hub is as the environment says: a job run with nothing set reaches the hub (a cluster with
internet loads `model.path=BAAI/bge-small-en-v1.5`), one run with HF_HUB_OFFLINE=1 stays
offline, and the hub client must see the setting, not only the environment. huggingface_hub
reads HF_HUB_OFFLINE once, when first imported. The import-time defaults turn off transformers'
"Loading weights" bar (HF_HUB_DISABLE_PROGRESS_BARS, read at import too), and a Ray worker gets
the driver's hub switch (runtime.start_ray)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINTS = sorted(str(p.relative_to(REPO)) for p in (REPO / "jobs").glob("*.py"))

# Import the entry point as a module (its main() does not run), then ask the hub client.
PROBE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("entry_point", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
import datasets, huggingface_hub.constants, transformers.utils.logging
print(
    huggingface_hub.constants.HF_HUB_OFFLINE,  # what is_offline_mode() returns (hub 1.x and 0.x)
    datasets.config.HF_HUB_OFFLINE,
    transformers.utils.logging.is_progress_bar_enabled(),
)
"""
HUB_VARIABLES = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HF_HUB_DISABLE_PROGRESS_BARS",
)


def _probe(entry_point: str, **env: str) -> subprocess.Popen:
    """Start the probe of one entry point: it prints [hub client offline, datasets offline,
    transformers progress bars on]."""
    clean = {k: v for k, v in os.environ.items() if k not in HUB_VARIABLES}
    return subprocess.Popen(
        [sys.executable, "-c", PROBE, entry_point],
        cwd=REPO,
        env={**clean, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _answer(probe: subprocess.Popen) -> list[str]:
    stdout, stderr = probe.communicate(timeout=300)
    assert probe.returncode == 0, stderr[-3000:]
    return stdout.split()


@pytest.fixture(scope="module")
def answers() -> dict[tuple[str, str], list[str]]:
    """Every probe, each in a fresh interpreter (the setting is read once per process), all
    started at once: an interpreter spends most of its start importing, one core each."""
    cases = {
        (entry_point, "HF_HUB_OFFLINE=1"): {"HF_HUB_OFFLINE": "1"} for entry_point in ENTRY_POINTS
    }
    cases["jobs/train_informin.py", ""] = {}
    cases["jobs/train_informin.py", "HF_HUB_DISABLE_PROGRESS_BARS=0"] = {
        "HF_HUB_DISABLE_PROGRESS_BARS": "0"
    }
    probes = {case: _probe(case[0], **env) for case, env in cases.items()}
    return {case: _answer(probe) for case, probe in probes.items()}


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_every_entry_point_tells_the_hub_client_it_is_offline(answers, entry_point):
    assert answers[entry_point, "HF_HUB_OFFLINE=1"] == ["True", "True", "False"]


def test_with_nothing_set_a_job_reaches_the_hub(answers):
    assert answers["jobs/train_informin.py", ""][:2] == ["False", "False"]


def test_a_user_who_wants_progress_bars_keeps_them(answers):
    assert answers["jobs/train_informin.py", "HF_HUB_DISABLE_PROGRESS_BARS=0"][2] == "True"


def test_ray_workers_get_the_drivers_hub_switch():
    from distributed_emb.runtime import HUB_SWITCHES

    assert "HF_HUB_OFFLINE" in HUB_SWITCHES and "HF_HOME" in HUB_SWITCHES
