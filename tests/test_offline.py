"""Every entry point runs offline unless the user opts in (HF_HUB_OFFLINE=0): the hub client
must see the setting, not only the environment. huggingface_hub reads HF_HUB_OFFLINE once, when
first imported, so setting it in a job's main() (after the job's imports brought in
transformers) left the variable at 1 and the client online. The same import-time defaults turn
off transformers' "Loading weights" bar (HF_HUB_DISABLE_PROGRESS_BARS, read at import too)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINTS = [
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "jobs").glob("*.py")),
    "distributed_emb/infocse/compare.py",
]

# Import the entry point as a module (its main() does not run), then ask the hub client.
PROBE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("entry_point", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
import datasets, huggingface_hub, transformers.utils.logging
print(
    huggingface_hub.is_offline_mode(),
    datasets.config.HF_HUB_OFFLINE,
    transformers.utils.logging.is_progress_bar_enabled(),
)
"""


def _hub_offline(entry_point: str, **env: str) -> list[str]:
    """[hub client offline, datasets offline, transformers progress bars on]"""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE",
            "HF_DATASETS_OFFLINE",
            "HF_HUB_DISABLE_PROGRESS_BARS",
        )
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE, entry_point],
        cwd=REPO,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_every_entry_point_leaves_the_hub_client_offline(entry_point):
    assert _hub_offline(entry_point) == ["True", "True", "False"]


def test_a_user_who_opts_in_stays_online():
    assert _hub_offline("jobs/train_informin.py", HF_HUB_OFFLINE="0")[:2] == ["False", "False"]


def test_a_user_who_wants_progress_bars_keeps_them():
    assert _hub_offline("jobs/train_informin.py", HF_HUB_DISABLE_PROGRESS_BARS="0")[2] == "True"
