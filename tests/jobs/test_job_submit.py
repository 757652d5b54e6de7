"""`ray job submit` of the jobs against a real local head, as a user would on a cluster: the
training job on a head with exactly the Train workers' CPUs.

A search on exactly its trials' CPUs is tests/tune/test_tune_search_end_to_end.py (2 CPUs, 2
workers per trial: it finishes only if the plan leaves Ray Data its share); a search driven on
a cluster it joined, tests/cluster/test_node_loss.py; InfoCSE jobs submitted to a cluster,
tests/cluster/test_infocse_object_storage.py.

The head runs with token auth (as cluster/*.yaml configure every node), the job goes through
the dashboard's job API with cluster/runtime_env.yaml (plus the hub off: the test machines have
no internet) and `--working-dir .`, and the test only
looks at what a user gets back: the job's final status and a model directory that plain
`SentenceTransformer(path)` loads.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml
from harness.autoscaling_cluster import HUB_OFFLINE
from harness.ray_head import RAY_CLI, local_ray_head

from distributed_emb.paths import shipped_corpus

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STEPS = 4


@pytest.fixture(scope="module")
def head():
    """One head for the module's jobs, as a user's cluster takes job after job: token
    auth and exactly the machine's 2 CPUs, i.e. num_workers × cpus_per_worker of every job
    here. Each job is its own driver, so nothing of one is left holding CPUs for the next
    (were it, the next job could not fit and would fail or wait, not pass). One start-up and
    shutdown of the head instead of one per test."""
    with local_ray_head(token=secrets.token_urlsafe(32), num_cpus=2) as started:
        yield started


def _tiny_run_config(tmp_path: Path, model_path: str) -> Path:
    corpus = tmp_path / "corpus.txt"
    lines = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()[:200]
    corpus.write_text("\n".join(lines) + "\n")
    config = {
        "model": {"path": model_path, "max_seq_length": 16},
        "data": {"path": str(corpus)},
        "train": {"num_workers": 2, "batch_size": 8, "max_steps": STEPS},
        "eval": {"eval_steps": 2, "max_pairs": 32, "test_after_training": False},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_submitted_training_job_succeeds_and_exports_a_loadable_model(
    head, tmp_path, tiny_bert_path
):
    from sentence_transformers import SentenceTransformer

    config_path = _tiny_run_config(tmp_path, tiny_bert_path)
    output = tmp_path / "run"
    submission_id = f"test-train-{secrets.token_hex(4)}"
    # The machine's own 2 CPUs, exactly num_workers × cpus_per_worker: the resource plan must
    # leave Ray Data its share (before it, the job hung at `Split Repartition: 0%`).
    # Fails in seconds, before Ray Train starts: 300 s is far more than it may take.
    never = _submit(head, config_path, tmp_path / "never", "train.num_workers=8", timeout=300)
    never_logs = never.stdout + never.stderr
    submitted = _submit(head, config_path, output, submission_id=submission_id)
    logs = submitted.stdout + submitted.stderr
    status = requests.get(
        f"{head.dashboard_url}/api/jobs/{submission_id}",
        headers=head.auth_headers(),
        timeout=30,
    ).json()
    # Can never fit: fails before Ray Train starts, with the numbers and the fix.
    assert never.returncode != 0, never_logs[-4000:]
    assert "does not fit the cluster" in never_logs, never_logs[-4000:]
    assert "8 Train workers × 1 CPU + Ray Data 1 CPU = 9 CPU" in never_logs
    assert "train.num_workers=1" in never_logs
    assert "TrainController" not in never_logs  # Ray Train never started
    assert submitted.returncode == 0, logs[-6000:]
    assert "resource plan:" in logs and "lowered to leave Ray Data its share" in logs, logs[-6000:]
    assert status["status"] == "SUCCEEDED", (status, logs[-6000:])

    model_dir = output / "model"
    assert model_dir.is_dir(), logs[-3000:]
    model = SentenceTransformer(str(model_dir), device="cpu")
    embeddings = model.encode(["A cat sits on the mat.", "Stocks fell sharply today."])
    assert embeddings.shape == (2, 32)  # tiny BERT's hidden size
    assert np.isfinite(embeddings).all()
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["steps"] == STEPS


def _runtime_env_json() -> str:
    """cluster/runtime_env.yaml as a user submits it, with the hub switched off (HUB_OFFLINE):
    the file leaves the hub to the user, and these machines cannot reach it."""
    runtime_env = yaml.safe_load((REPO / "cluster" / "runtime_env.yaml").read_text())
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **HUB_OFFLINE}
    return json.dumps(runtime_env)


def _submit(
    head,
    config_path: Path,
    output: Path,
    *overrides: str,
    submission_id: str | None = None,
    timeout: float = 900,
) -> subprocess.CompletedProcess:
    """`ray job submit` of the training job to `head`, as a user runs it on a cluster."""
    return subprocess.run(
        [
            RAY_CLI,
            "job",
            "submit",
            "--address",
            head.dashboard_url,
            *(["--submission-id", submission_id] if submission_id else []),
            "--runtime-env-json",
            _runtime_env_json(),
            "--working-dir",
            ".",
            "--",
            "python",
            "jobs/train_informin.py",
            "--config",
            str(config_path),
            "--output",
            str(output),
            *overrides,
        ],  # fmt: skip
        cwd=REPO,
        env=head.client_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
