"""cluster/runtime_env.yaml: Ray accepts it, and the working directory it uploads is the code,
small enough for Ray's upload limit, without virtualenvs, outputs or git history."""

from __future__ import annotations

import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
RUNTIME_ENV = REPO / "cluster" / "runtime_env.yaml"


def _runtime_env() -> dict:
    return yaml.safe_load(RUNTIME_ENV.read_text())


def test_ray_accepts_the_runtime_env():
    from ray.runtime_env import RuntimeEnv

    env = RuntimeEnv(**_runtime_env())  # validates field names and types (env_vars: str → str)
    # Offline switches belong to the test harness, not to a real cluster's jobs.
    assert "HF_HUB_OFFLINE" not in env["env_vars"] and "TRANSFORMERS_OFFLINE" not in env["env_vars"]
    assert env["env_vars"]["TOKENIZERS_PARALLELISM"] == "false"
    assert env["working_dir"] == "."


def test_uploaded_working_dir_is_code_only_and_under_rays_limit(tmp_path):
    from ray._private import ray_constants
    from ray._private.runtime_env.packaging import GCS_STORAGE_MAX_SIZE, create_package

    # What `ray job submit --runtime-env cluster/runtime_env.yaml --working-dir .` zips.
    excludes = ray_constants.get_runtime_env_default_excludes() + _runtime_env()["excludes"]
    package = tmp_path / "working_dir.zip"
    create_package(str(REPO), package, include_gitignore=True, excludes=excludes)

    names = zipfile.ZipFile(package).namelist()
    assert "jobs/train_informin.py" in names
    assert "distributed_emb/config.py" in names
    assert "cluster/runtime_env.yaml" in names
    for unwanted in (".venv/", ".git/", "outputs/", "__pycache__/"):
        assert not [n for n in names if n.startswith(unwanted) or f"/{unwanted}" in n], unwanted
    assert package.stat().st_size < GCS_STORAGE_MAX_SIZE / 4, package.stat().st_size


def test_excludes_do_their_job_on_a_directory_with_the_usual_clutter(tmp_path):
    from ray._private.runtime_env.packaging import create_package

    project = tmp_path / "project"
    for relative in (
        "pkg/module.py",
        ".venv/lib/site.py",
        "outputs/run/model.safetensors",
        "pkg/__pycache__/module.cpython-311.pyc",
        "dist/pkg-0.1-py3-none-any.whl",
        "pkg.egg-info/PKG-INFO",
    ):
        (project / relative).parent.mkdir(parents=True, exist_ok=True)
        (project / relative).write_text("x")
    package = tmp_path / "p.zip"
    create_package(
        str(project), package, include_gitignore=True, excludes=_runtime_env()["excludes"]
    )
    assert [n for n in zipfile.ZipFile(package).namelist() if not n.endswith("/")] == [
        "pkg/module.py"
    ]
