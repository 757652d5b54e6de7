"""Every entry point runs offline unless the user opts in (HF_HUB_OFFLINE=0): the hub client
must see the setting, not only the environment. huggingface_hub reads HF_HUB_OFFLINE once, when
first imported, so setting it in a job's main() (after the job's imports brought in
transformers) left the variable at 1 and the client online."""

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
import datasets, huggingface_hub
print(huggingface_hub.is_offline_mode(), datasets.config.HF_HUB_OFFLINE)
"""


def _hub_offline(entry_point: str, **env: str) -> str:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
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
    assert _hub_offline(entry_point) == ["True", "True"]


def test_a_user_who_opts_in_stays_online():
    assert _hub_offline("jobs/train_informin.py", HF_HUB_OFFLINE="0") == ["False", "False"]
