"""jobs/evaluate.py end to end, through a Ray Data actor pool and in this process (the default
on one machine), with a tiny model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from harness.jobs import checked_config, run


def test_bad_flags_exit_with_the_key(tmp_path, capsys):
    assert run("evaluate", [str(tmp_path), "--tasks", "sts,nonsense"]) == 2
    assert "tasks: unknown task 'nonsense'" in capsys.readouterr().err


@pytest.mark.ray
def test_evaluate_job_with_ray_writes_table_and_json(tiny_bert_path, ray_local, tmp_path, capsys):
    output = tmp_path / "results.json"
    # Default --senteval-data: the shipped STS-B-only directory.
    code = run(
        "evaluate",
        [
            tiny_bert_path,
            "--pooler",
            "mean",
            "--tasks",
            "STSBenchmark,retrieval",
            "--batch-size",
            "64",
            "--max-seq-len",
            "32",
            "--output",
            str(output),
            "--retrieval",
            str(_beir_dir(tmp_path / "beir")),
            "encode.use_ray=true",
            "encode.num_cpus_per_actor=0.5",
        ],
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "STS-B" in printed and "Retrieval STSBenchmark-retrieval" in printed
    assert "Retrieval, BEIR layout" in printed
    saved = json.loads(output.read_text())
    assert saved["config"]["encode"]["use_ray"] is True
    assert saved["config"]["encode"]["max_seq_length"] == 32
    assert saved["sts"]["STSBenchmark"]["n"] == 1379
    assert -100 <= saved["sts"]["STSBenchmark"]["spearman"] <= 100
    assert saved["wall_time_s"]["sts"]["encode_s"] > 0
    # The BEIR directory too, its queries and corpus embedded by the pool.
    assert set(saved["beir"]) == {"dev", "test"} and saved["wall_time_s"]["beir"]["encode_s"] > 0
    assert saved["beir"]["test"]["n_corpus"] == 5


def test_evaluate_job_on_one_machine_encodes_in_process(tiny_bert_path, tmp_path, monkeypatch):
    """No cluster to join, one actor: encoding in this process; Ray is neither started nor used."""
    from distributed_emb import cli
    from distributed_emb.model import embedder

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cli, "start_ray", lambda *a, **k: pytest.fail("the job started Ray"))
    monkeypatch.setattr(embedder, "ray_encode", lambda *a, **k: pytest.fail("encoded on Ray"))
    output = tmp_path / "results.json"
    argv = [tiny_bert_path, "--pooler", "mean", "--tasks", "STSBenchmark", "--output", str(output)]
    assert run("evaluate", [*argv, "--max-seq-len", "32"]) == 0
    saved = json.loads(output.read_text())
    assert saved["config"]["encode"]["use_ray"] == "auto"
    assert saved["sts"]["STSBenchmark"]["n"] == 1379


def _stsb_only(root: Path) -> Path:
    """A SentEval-shaped tree root/data/downstream holding STS-B test only (the shipped copy)."""
    from distributed_emb.paths import shipped_senteval_dir

    downstream = root / "data" / "downstream"
    target = downstream / "STS" / "STSBenchmark"
    target.mkdir(parents=True)
    source = Path(shipped_senteval_dir()) / "STS" / "STSBenchmark" / "sts-test.csv"
    (target / "sts-test.csv").write_bytes(source.read_bytes())
    return downstream


@pytest.mark.parametrize("level", ["downstream", "data", "checkout"])
def test_senteval_data_finds_downstream_under_data_or_a_checkout(tmp_path, level):
    downstream = _stsb_only(tmp_path)
    given = {"downstream": downstream, "data": downstream.parent, "checkout": tmp_path}[level]
    config = checked_config("evaluate", ["--senteval-data", str(given), "--tasks", "STSBenchmark"])
    assert Path(config.eval.senteval_dir) == downstream


def test_no_data_for_any_requested_task_exits_2_naming_the_layout(tmp_path, capsys):
    downstream = _stsb_only(tmp_path)
    output = tmp_path / "results.json"
    code = run(
        "evaluate",
        ["--senteval-data", str(downstream.parent), "--tasks", "transfer", "--no-ray",
         "--output", str(output)],
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "eval.senteval_dir: no data for any requested task (MR, CR, SUBJ" in err
    assert "data/downstream directory (or its parent data/)" in err
    assert "STS/STSBenchmark/sts-test.csv" in err
    assert not output.exists()  # refused before any work: no empty results file


def test_some_requested_tasks_present_is_not_an_error(tmp_path):
    downstream = _stsb_only(tmp_path)
    config = checked_config("evaluate", ["--senteval-data", str(downstream), "--tasks", "sts"])
    assert config.eval.senteval_dir == str(downstream)  # STS12–16 and SICK are skipped later


def test_evaluate_job_without_ray_reads_senteval_data_given_as_data_dir(
    tiny_bert_path, tmp_path, capsys
):
    downstream = _stsb_only(tmp_path / "SentEval")
    output = tmp_path / "results.json"
    code = run(
        "evaluate",
        [tiny_bert_path, "--senteval-data", str(downstream.parent), "--tasks", "STSBenchmark",
         "--pooler", "mean", "--max-seq-len", "32", "--no-ray", "--output", str(output)]
    )  # fmt: skip
    assert code == 0
    saved = json.loads(output.read_text())
    assert Path(saved["senteval_dir"]) == downstream
    assert saved["sts"]["STSBenchmark"]["n"] == 1379
    assert saved["skipped"] == []


def _beir_dir(root: Path) -> Path:
    """A small retrieval set in the BEIR layout, splits dev and test."""
    (root / "qrels").mkdir(parents=True)
    corpus = ["A cat sits on the mat.", "Dogs bark at night.", "The stock market fell.",
              "Rain is expected tomorrow.", "A kitten sleeps on a rug."]  # fmt: skip
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n"
                for i, t in enumerate(corpus))
    )  # fmt: skip
    queries = ["where is the cat", "barking dogs", "shares dropped", "weather forecast"]
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(queries))
    )
    header = "query-id\tcorpus-id\tscore\n"
    (root / "qrels" / "test.tsv").write_text(header + "q0\td0\t2\nq0\td4\t1\nq1\td1\t1\n")
    (root / "qrels" / "dev.tsv").write_text(header + "q2\td2\t1\nq3\td3\t1\nq3\td2\t0\n")
    return root


def test_evaluate_job_scores_a_beir_directory_alone(tiny_bert_path, tmp_path, capsys):
    """--retrieval without --tasks: the BEIR splits only, their tables and per-query values."""
    output = tmp_path / "results.json"
    argv = [tiny_bert_path, "--retrieval", str(_beir_dir(tmp_path / "beir")), "--no-ray",
            "--pooler", "mean", "--max-seq-len", "32", "--output", str(output)]  # fmt: skip
    assert run("evaluate", argv) == 0
    printed = capsys.readouterr().out
    assert "nDCG@10  MAP@100" in printed and "STS" not in printed
    saved = json.loads(output.read_text())
    assert "sts" not in saved and "transfer" not in saved
    test = saved["beir"]["test"]
    assert (test["n_queries"], test["n_corpus"]) == (2, 5)
    assert list(test["metrics"]) == [
        "ndcg@10",
        "map@100",
        "recall@1",
        "recall@10",
        "recall@100",
        "mrr@10",
    ]
    assert test["metrics"]["recall@10"] == 100.0  # 5 documents: all of them are hits
    assert set(test["per_query"]["ndcg@10"]) == {"q0", "q1"}
    assert saved["beir"]["dev"]["n_queries"] == 2


def test_with_tasks_the_beir_directory_is_scored_besides_them(tmp_path):
    beir = str(_beir_dir(tmp_path))
    from distributed_emb.evaluation.suite import senteval_tasks

    alone = checked_config("evaluate", ["--retrieval", beir])
    assert senteval_tasks(alone.eval) == {} and alone.eval.retrieval_splits is None
    both = checked_config(
        "evaluate", ["--retrieval", beir, "--retrieval-splits", "test", "--tasks", "STSBenchmark"]
    )
    assert senteval_tasks(both.eval) == {"sts": ["STSBenchmark"]}
    assert both.eval.retrieval_splits == ["test"]
    assert list(senteval_tasks(checked_config("evaluate", []).eval)) == [
        "sts", "transfer", "retrieval", "geometry"
    ]  # fmt: skip


@pytest.mark.parametrize(
    "qrels, splits, message",
    [
        ("q0\tnope\t1\n", "test", r"qrels/test.tsv:2: corpus-id 'nope' is not in corpus.jsonl"),
        ("q0\td0\t1\n", "dev,train", r"qrels/train.tsv: no such file; the splits .* are dev, test"),
    ],
    ids=["unknown corpus-id", "missing split"],
)  # fmt: skip
def test_beir_data_is_checked_before_any_model_loads(
    tiny_bert_path, tmp_path, capsys, monkeypatch, qrels, splits, message
):
    from distributed_emb.evaluation import suite

    monkeypatch.setattr(suite, "make_encoders", lambda *a, **k: pytest.fail("loaded a model"))
    beir = _beir_dir(tmp_path)
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    argv = [tiny_bert_path, "--retrieval", str(beir), "--retrieval-splits", splits, "--no-ray"]
    assert run("evaluate", argv) == 2
    assert re.search(message, capsys.readouterr().err)
