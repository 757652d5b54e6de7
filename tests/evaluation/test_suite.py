"""The suite: task selection, skipping absent data, errors for broken data, table and JSON."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import typing
from pathlib import Path

import numpy as np
import pytest

from distributed_emb.checks import ConfigError
from distributed_emb.config import load_config
from distributed_emb.evaluation.results_tables import format_results, write_results
from distributed_emb.evaluation.senteval_data import SentEvalDataError
from distributed_emb.evaluation.suite import (
    EncodeSettings,
    EvaluationConfig,
    TaskSelection,
    evaluate,
    resolve_tasks,
)
from distributed_emb.evaluation.transfer import TransferConfig
from distributed_emb.model.sentence_transformer import POOLERS
from distributed_emb.paths import shipped_senteval_dir


def hashed_encoder(calls: list[int] | None = None):
    """A fast stand-in encoder: a fixed pseudo-random vector per distinct sentence."""

    def encode(sentences):
        if calls is not None:
            calls.append(len(sentences))
        rows = []
        for s in sentences:
            seed = int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "little")
            rows.append(np.random.default_rng(seed).normal(size=16))
        return np.array(rows)

    return encode


def test_resolve_tasks_groups_names_and_comma_lists():
    assert resolve_tasks(["sts"]) == {
        "sts": ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
    }
    assert resolve_tasks(["MRPC,STS12", "retrieval"]) == {
        "sts": ["STS12"],
        "transfer": ["MRPC"],
        "retrieval": ["STSBenchmark-retrieval"],
    }
    assert set(resolve_tasks(["all"])) == {"sts", "transfer", "retrieval", "geometry"}
    with pytest.raises(ValueError, match="unknown task 'STS17'"):
        resolve_tasks(["STS17"])


def test_config_validation_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="^eval.tasks: unknown task 'bogus'"):
        load_config(EvaluationConfig, None, ["eval.tasks=[sts,bogus]"])
    with pytest.raises(ConfigError, match=r"^model.path: .*nope is not a model directory"):
        load_config(EvaluationConfig, None, [f"model.path={tmp_path / 'nope'}"])
    # The keys from before the one vocabulary still work (warned).
    old = load_config(EvaluationConfig, None, [f"model={tmp_path}", "tasks=[sts]"])
    assert (old.model.path, old.eval.tasks) == (str(tmp_path), ["sts"])
    with pytest.raises(ConfigError, match=r"^retrieval.ks: is empty; give at least one k >= 1"):
        load_config(EvaluationConfig, None, ["retrieval.ks=[]"])
    with pytest.raises(ConfigError, match=r"^transfer.kfold_c: give at least one C"):
        load_config(EvaluationConfig, None, ["transfer.kfold_c=[]"])


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "encode.pooler=max",
            "encode.pooler: expected one of ['cls', 'cls_before_pooler', 'mean'] or null, "
            "got 'max'",
        ),
        ("encode.batch_size=0", "encode.batch_size: must be >= 1, got 0 — sentences per"),
        ("encode.concurrency=0", "encode.concurrency: must be >= 1, got 0 — encoding actors"),
        ("encode.max_seq_length=2", "encode.max_seq_length: must be >= 4 or null, got 2 — "),
        ("encode.use_ray=maybe", "encode.use_ray: expected true or false or 'auto', got 'maybe'"),
        ("encode.torch_threads=0", "encode.torch_threads: must be >= 1 or null, got 0 — "),
        ("retrieval.ks=[1, 0]", "retrieval.ks[1]: must be >= 1, got 0 — the k of each"),
        ("retrieval.threshold=6", "retrieval.threshold: must be in [0, 5], got 6 — STS-B test"),
        ("transfer.kfold=1", "transfer.kfold: must be >= 2, got 1 — folds of the"),
        ("transfer.seed=-1", "transfer.seed: must be in [0, 4294967295], got -1"),
        ("encode.batch_size='8'", "encode.batch_size: expected an integer, got '8'"),
        ("encode.poolr=mean", "unknown config key 'encode.poolr'; known keys: ['batch_size', "),
    ],
)
def test_config_declarations_name_the_key(override, message):
    with pytest.raises(ConfigError) as error_info:
        load_config(EvaluationConfig, None, [override])
    assert str(error_info.value).startswith(message)


def test_the_pooler_choices_are_the_models():
    hint = typing.get_type_hints(EncodeSettings, include_extras=True)["pooler"]
    choices = {a for arg in typing.get_args(typing.get_args(hint)[0]) for a in typing.get_args(arg)}
    assert choices == set(POOLERS)


def _tiny_senteval(tmp_path: Path) -> Path:
    """STS-B (shipped copy) plus a small MR; everything else absent."""
    root = tmp_path / "downstream"
    shutil.copytree(shipped_senteval_dir(), root)
    (root / "MR").mkdir()
    rng = np.random.default_rng(0)
    for name in ("rt-polarity.pos", "rt-polarity.neg"):
        words = [" ".join(f"w{int(i)}" for i in rng.integers(0, 50, size=6)) for _ in range(40)]
        (root / "MR" / name).write_text("\n".join(words) + "\n", encoding="latin-1")
    return root


def test_evaluate_skips_absent_tasks_and_reports_present_ones(tmp_path):
    root = _tiny_senteval(tmp_path)
    config = EvaluationConfig(
        eval=TaskSelection(
            senteval_dir=str(root), tasks=["sts", "MR", "SST2", "retrieval", "geometry"]
        ),
        transfer=TransferConfig(kfold=2, inner_kfold_c=(1.0,), kfold_c=(1.0,)),
    )
    calls: list[int] = []
    output = evaluate(config, encode=hashed_encoder(calls))
    assert set(output["sts"]) == {"STSBenchmark"}
    assert set(output["transfer"]) == {"MR"} and output["transfer"]["MR"]["n"] == 80
    skipped = {s["task"] for s in output["skipped"]}
    assert skipped == {"STS12", "STS13", "STS14", "STS15", "STS16", "SICKRelatedness", "SST2"}
    # One encoding pass for sts and one for transfer; retrieval and geometry read STS-B test,
    # whose sentences the sts pass already embedded.
    assert len(calls) == 2
    assert output["wall_time_s"]["retrieval"]["n_sentences_encoded"] == 0
    # A random encoder knows nothing: STS-B near 0, not near the real model's 82.
    assert abs(output["sts"]["STSBenchmark"]["spearman"]) < 10
    assert output["retrieval"]["STSBenchmark-retrieval"]["n_queries"] > 100
    assert set(output["wall_time_s"]) == {"sts", "transfer", "retrieval", "geometry", "total_s"}

    table = format_results(output)
    assert re.search(r"STS12\s+STS13.*STS-B\s+SICK-R\s+Avg\.", table)
    assert "(Avg. over the 1 of 7 tasks present)" in table
    assert "SST2: no data in" in table

    path = tmp_path / "out" / "results.json"
    write_results(output, path)
    saved = json.loads(path.read_text())
    assert saved["sts"]["STSBenchmark"]["spearman"] == pytest.approx(
        output["sts"]["STSBenchmark"]["spearman"]
    )
    assert saved["config"]["transfer"]["kfold"] == 2


def test_present_but_malformed_task_raises_with_file_and_line(tmp_path):
    root = _tiny_senteval(tmp_path)
    path = root / "STS/STSBenchmark/sts-test.csv"
    lines = path.read_text().split("\n")
    lines[9] = "g\tf\t2012\t1\tbad\tA.\tB."
    path.write_text("\n".join(lines))
    config = EvaluationConfig(eval=TaskSelection(senteval_dir=str(root), tasks=["STSBenchmark"]))
    with pytest.raises(SentEvalDataError, match=re.escape(f"{path}:10:")):
        evaluate(config, encode=hashed_encoder())


def test_incomplete_task_is_an_error_not_a_skip(tmp_path):
    root = _tiny_senteval(tmp_path)
    (root / "MR/rt-polarity.neg").unlink()
    config = EvaluationConfig(eval=TaskSelection(senteval_dir=str(root), tasks=["MR"]))
    with pytest.raises(SentEvalDataError, match="incomplete.*rt-polarity.neg"):
        evaluate(config, encode=hashed_encoder())
