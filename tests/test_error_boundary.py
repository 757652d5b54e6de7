"""One error boundary (cli.run_job): a failure that comes from what the user gave — an output
path, a model directory, a bucket, a hub name, an input file that is not what its name says —
reaches the user as one line naming it, with exit status 2, never a traceback. Each class of
failure is driven through every job it applies to, in this process.

All but one case fail before Ray starts (the jobs' checks), so they cost a config load each;
the last one reads a broken documents file on object storage inside Ray Data tasks and shows
that an error raised on the cluster is reported the same way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.jobs import run

from distributed_emb.paths import shipped_corpus

# What makes each job's config valid and cheap, so that the failure reached is the one tested.
BASE = {
    "train_informin": [],
    "finetune_mcr2": [
        "model.compression_head=null",  # its default reads the MCR² job's outputs
        f"data.path={shipped_corpus('wiki_sentences.txt')}",
        "data.group_column=null",
        "loss.mcr2_weight=0",
        "loss.contrastive_weight=1",
    ],
    "train_infocse": [],
    "train_mcr2": [],
    "tune_informin": [],
    "compare_infocse": [],
    "evaluate": ["--no-ray", "--tasks", "STSBenchmark"],
}
DIRECTORY_JOBS = [job for job in BASE if job != "evaluate"]
# The key each job reads its text input from, and how it takes a list.
INPUT_KEY = {
    "train_informin": "data.path={}",
    "finetune_mcr2": "data.path={}",
    "tune_informin": "data.path={}",
    "train_infocse": "documents.paths=[{}]",
    "compare_infocse": "documents.paths=[{}]",
    "train_mcr2": "sentences.paths=[{}]",
}


def refused(job: str, argv: list[str], capsys) -> str:
    """The job's one line on stderr; it exited 2 and printed no traceback."""
    code = run(job, [*BASE[job], *argv])
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith(("error:", "config error:"))]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.fixture
def regular_file(tmp_path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("not a directory\n")
    return path


@pytest.mark.parametrize("job", list(BASE))
def test_an_output_path_inside_a_file(job, regular_file, capsys):
    target = regular_file / ("results.json" if job == "evaluate" else "out")
    line = refused(job, ["--output", str(target)], capsys)
    assert str(regular_file) in line and "not a directory" in line.lower()


@pytest.mark.parametrize("job", list(BASE))
def test_a_model_directory_with_a_broken_config(job, tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{ this is not json")
    argv = [str(model)] if job == "evaluate" else [f"model.path={model}"]
    line = refused(job, [*argv, "--output", str(tmp_path / "out")], capsys)
    assert f"{model / 'config.json'} is not valid JSON" in line


@pytest.mark.parametrize("job", [j for j in DIRECTORY_JOBS if j != "train_mcr2"])
def test_a_length_the_model_cannot_take(job, tmp_path, capsys):
    """Past its position embeddings a model fails inside a Train worker, minutes in: refused
    before Ray, with the model's own limit (the packaged MiniLM takes 512 tokens)."""
    line = refused(job, ["model.max_seq_length=4096", "--output", str(tmp_path / "out")], capsys)
    assert "model.max_seq_length: must be <= 512" in line and "got 4096" in line


@pytest.mark.parametrize("job", [*DIRECTORY_JOBS])
def test_a_bucket_that_does_not_exist(job, s3, tmp_path, capsys):
    if job == "train_mcr2":  # reads sentences from storage; writes only --output
        argv = [INPUT_KEY[job].format("s3://no-such-bucket-x1/sentences.jsonl")]
    else:
        argv = ["output.storage_path=s3://no-such-bucket-x1/runs"]
    line = refused(job, [*argv, "--output", str(tmp_path / "out")], capsys)
    assert "no-such-bucket-x1" in line


@pytest.mark.parametrize("job", [*INPUT_KEY, "evaluate"])
def test_a_hub_name_without_the_hub(job, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if job == "evaluate":
        argv = ["no-such-org/no-such-model"]
    else:
        argv = [INPUT_KEY[job].format("no-such-org/no-such-dataset")]
    line = refused(job, [*argv, "--output", str(tmp_path / "out")], capsys)
    assert "no-such-org/no-such-" in line


@pytest.mark.parametrize("job", list(INPUT_KEY))
def test_an_input_file_that_is_not_what_its_name_says(job, tmp_path, capsys):
    fake = tmp_path / "sentences.parquet"
    fake.write_text("plain text, not Parquet\n" * 10)
    line = refused(job, [INPUT_KEY[job].format(fake), "--output", str(tmp_path / "out")], capsys)
    assert f"{fake}: not a readable parquet file" in line


@pytest.mark.parametrize("job", [*DIRECTORY_JOBS, "evaluate"])
def test_a_malformed_line_of_the_users_retrieval_set(job, tmp_path, capsys):
    """Every job that scores eval.retrieval_dir reads it before Ray starts: a bad line is
    named by file and line there, not in every Train worker (or encoding pass) minutes in."""
    from harness.tiny_run import tiny_beir_dir

    beir = tiny_beir_dir(tmp_path / "beir")
    with (beir / "corpus.jsonl").open("a") as corpus:
        corpus.write('{"_id": "d99", "text": \n')  # line 41: not JSON
    argv = ["--retrieval", str(beir)] if job == "evaluate" else [f"eval.retrieval_dir={beir}"]
    line = refused(job, [*argv, "--output", str(tmp_path / "out")], capsys)
    assert f"{beir / 'corpus.jsonl'}:41" in line


@pytest.mark.ray
@pytest.mark.slow
def test_an_input_file_read_on_the_cluster_is_reported_the_same_way(s3, tmp_path, capsys):
    """Documents on object storage are read by Ray Data tasks once Ray is up (never on the
    driver): the task's error comes back wrapped by Ray, and the boundary reports its cause in
    the same one line, last. (Ray Data logs the failed task itself before that.)"""
    bucket = s3.create_bucket("boundary-documents")
    s3.client().put_object(
        Bucket="boundary-documents", Key="documents.parquet", Body=b"plain text\n" * 10
    )
    fake = f"{bucket}/documents.parquet"
    import ray

    assert not ray.is_initialized(), "the job starts its own local Ray"
    try:
        code = run(
            "train_infocse",
            [f"documents.paths=[{fake}]", "ray.num_cpus=2", "ray.object_store_memory_mb=256",
             "--output", str(tmp_path / "out")],
        )  # fmt: skip
    finally:
        ray.shutdown()  # the job's process would have exited; later modules start their own
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("error: ") and "documents.parquet: not a readable parquet" in last
