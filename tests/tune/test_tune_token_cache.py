"""A Tune search of 2 trials tokenises its corpus once (data/token_cache.py): the driver writes
one build of tokenised shards, and both trials train on those token ids.

How the count is shown: every tokenising pass of the cache writes its own `data-<uuid>`
directory, so the directories are the count of passes. The trials cannot tokenise on their own
either: their dataset holds token ids and no text column (a tokenising stage on it would fail
on the missing column), and `data.tokenize_in=ray_data` is set so that, without the cache, each
trial's pipeline would tokenise the corpus again.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from distributed_emb.paths import shipped_corpus

pytestmark = [pytest.mark.slow, pytest.mark.ray]

REPO = Path(__file__).resolve().parents[2]


def _load_job():
    spec = importlib.util.spec_from_file_location("tune_job", REPO / "jobs" / "tune_informin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_trials_read_one_tokenising_pass(tmp_path, tiny_bert_path):
    import ray
    import ray.data

    assert not ray.is_initialized(), "the job must start its own Ray (with the State API)"
    corpus = tmp_path / "corpus.txt"
    lines = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()[:200]
    corpus.write_text("\n".join(lines) + "\n")
    output = tmp_path / "out"
    try:
        code = _load_job().main(
            [
                "--config",
                str(REPO / "jobs" / "configs" / "tune_tiny.yaml"),
                "--num-samples",
                "2",
                "--output",
                str(output),
                f"model.path={tiny_bert_path}",
                f"data.path={corpus}",
                "data.tokenize_in=ray_data",
                "tune.scheduler=fifo",
                "train.max_steps=2",
                "ray.num_cpus=2",  # the core count of the machines CI runs on
                "ray.object_store_memory_mb=512",
            ]
        )
        assert code == 0

        builds = sorted((output / "ray_results" / "token_cache").glob("*/data-*"))
        assert len(builds) == 1, builds  # one tokenising pass for the whole search
        commit = json.loads((builds[0].parent / "COMMIT.json").read_text())
        assert commit["data"] == builds[0].name and commit["rows"] == 200
        shards = ray.data.read_parquet(str(builds[0]))
        assert "text" not in shards.columns() and "text__ids" in shards.columns()
    finally:
        ray.shutdown()

    results = [
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for path in (output / "search").glob("trial_*/result.json")
    ]
    assert len(results) == 2
    for reports in results:  # both trials trained on the cached ids
        assert max(report["step"] for report in reports) == 2
