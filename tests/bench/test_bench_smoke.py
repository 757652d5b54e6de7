"""The benchmark harness cannot silently rot: a tiny run produces every table, row and column.

No timed assertions (speed belongs in docs/BENCHMARKS.md, not in tests): only that each number
exists and is a sane positive value, and that the FLOP model the MFU column rests on is right.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.flops import training_flops
from bench.run_all import (
    BARE,
    BARE_GROUPED,
    PROJECT,
    PROJECT_GROUPED,
    ST,
    length_grouped,
)
from bench.section_profile import VARIANTS

REPO = Path(__file__).resolve().parents[2]  # `python -m bench.run_all` runs from here

EXPECTED = {
    "training_step": (
        [
            "contender",
            "sentences/s",
            "tokens/s",
            "× bare loop",
            "× sentence-transformers",
            "padding",
            "data wait",
        ],
        [PROJECT, PROJECT_GROUPED, BARE, ST, BARE_GROUPED],
    ),
    "hardware": (
        ["contender", "model GFLOP/s", "matmul GFLOP/s", "MFU"],
        [PROJECT, PROJECT_GROUPED, BARE, ST, BARE_GROUPED],
    ),
    "negatives": (
        [
            "setting",
            "step s",
            "global sentences/s",
            "negatives per row",
            "global batch",
            "× gathered",
            "data wait",
        ],
        ["gathered negatives (default)", "local negatives (loss.gather_negatives=false)"],
    ),
    "data_path": (
        ["stage", "sentences/s", "× training consumption (1 worker)", "worker data wait"],
        5,
    ),
    "annotation": (
        [
            "path",
            "seconds",
            "sentences/s",
            "× one process",
            "fixed cost s",
            "marginal sentences/s",
            "marginal × one process",
            "pairs",
        ],
        3,
    ),
    "speed_ab": (
        [
            "variant",
            "ms per step",
            "optimizer ms",
            "real tokens/s",
            "× default",
            "× before",
            "padding",
        ],
        list(VARIANTS),
    ),
    "memory": (["process", "batch", "peak RSS MB", "after building MB", "step adds MB"], 4),
    "profile_phases": (
        ["phase", "ms per step", "share"],
        ["collate", "forward+loss", "backward", "optimizer"],
    ),
    "profile_operators": (["operator", "calls per step", "self ms per step", "share of step"], 10),
}


@pytest.mark.parametrize("length", [8, 24])
def test_flop_model_matches_torch_flop_counter(length):
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=500,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = BertModel(config, add_pooling_layer=False)
    ids = torch.randint(0, 500, (3, length))
    with FlopCounterMode(display=False) as counter:
        hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        hidden.sum().backward()
    assert training_flops(config, [length] * 3) == pytest.approx(counter.get_total_flops())


def test_length_grouping_keeps_every_sentence_and_cuts_padding(minilm_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    words = "one two three four five six seven eight nine ten".split()
    texts = [" ".join(words[: 1 + (i * 7) % 10]) for i in range(16)]
    batches = [texts[i : i + 4] for i in range(0, 16, 4)]
    grouped = length_grouped(batches, tokenizer, 32)

    def padded(bs):
        return sum(len(b) * max(len(tokenizer(t)["input_ids"]) for t in b) for b in bs)

    assert sorted(t for b in grouped for t in b) == sorted(texts)
    assert [len(b) for b in grouped] == [4, 4, 4, 4]
    assert padded(grouped) < padded(batches)


@pytest.mark.slow
@pytest.mark.ray
def test_tiny_run_fills_every_table(tiny_bert_path, tmp_path):
    output = tmp_path / "bench"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run_all",
            "--tiny",
            "--model",
            tiny_bert_path,
            "--output",
            str(output),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((output / "results.json").read_text())
    assert results["errors"] == []
    report_lines = (output / "results.md").read_text().splitlines()
    assert sum(line.startswith("### ") for line in report_lines) == len(EXPECTED)
    tables = results["tables"]
    assert set(tables) == set(EXPECTED)
    for key, (columns, rows) in EXPECTED.items():
        table = tables[key]
        assert table["columns"] == columns, key
        labels = [row[0] for row in table["rows"]]
        if isinstance(rows, int):
            assert len(labels) == rows or (key == "profile_operators" and 0 < len(labels)), key
        else:
            assert labels == rows, key
        for row in table["rows"]:
            assert len(row) == len(columns), (key, row)
            numbers = [c for c in row[1:] if isinstance(c, (int, float))]
            assert all(math.isfinite(c) and c >= 0 for c in numbers), (key, row)

    step = {row[0]: row for row in tables["training_step"]["rows"]}
    assert all(step[name][1] > 0 and step[name][2] > 0 for name in step)
    assert step[BARE][3] == "1.00×" and step[ST][4] == "1.00×"
    negatives = {row[0]: row for row in tables["negatives"]["rows"]}
    gathered, local = negatives.values()
    assert gathered[3] == 2 * local[3] == gathered[4]  # W·B candidates vs B; same global batch
    assert all(row[2] > 0 for row in tables["memory"]["rows"])
    assert all(row[2] > 0 for row in tables["annotation"]["rows"])
    assert {e["at"] for e in results["load"]} >= {"start", "after step", "after profile"}


@pytest.mark.slow
@pytest.mark.ray
def test_encoding_bench_times_every_arm_and_checks_their_vectors(tiny_bert_path):
    """bench/encoding.py on 16 sentences with a tiny model: every arm timed and compared."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.encoding",
            "--rounds",
            "1",
            "--sentences",
            "16",
            "--model",
            tiny_bert_path,
            "--pooler",
            "mean",  # what sentence-transformers gives a plain HF directory
        ],
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["sentences"] == 16
    assert set(result["seconds"]) == {"sentence_transformers", "in_process", "ray_pool"}
    assert result["median_speed_vs_sentence_transformers"]["sentence_transformers"] == 1.0


@pytest.mark.slow
@pytest.mark.ray
def test_embed_bench_runs_every_arm_on_both_corpora_and_checks_their_vectors(tiny_bert_path):
    """bench/embed.py --small with a tiny model: the job (its own layout, and the int8 graph),
    sentence-transformers in one process and in a pool (of one process: each pool process
    imports sentence-transformers, ~6 core-seconds, and one shows the arm works), on sentences
    and on documents; each arm's vectors checked against one process's (the bench exits
    non-zero otherwise)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.embed",
            "--small",
            "--processes",
            "1",
            "--json",
            "--model",
            tiny_bert_path,
            "--pooler",
            "mean",
        ],
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout[-3000:]  # the JSON line alone on stdout
    result = json.loads(lines[0])
    arms = {"embed_job", "embed_job_onnx_int8", "st_one_process", "st_multi_process"}
    assert result["baseline"] == "st_one_process"
    assert result["compute_dtype_auto"] in ("float32", "bfloat16")  # what the default ran in
    assert set(result["corpora"]) == {"sentences", "documents"}
    for name, corpus in result["corpora"].items():
        assert corpus["rows"] > 0, name
        assert set(corpus["seconds"]) == arms, name
        assert all(rate > 0 for rate in corpus["rows_per_s"].values()), name
        assert corpus["vs_st_one_process"]["st_one_process"] == 1.0
        cosines = corpus["cosine_to_st_one_process"]
        assert set(cosines) == arms and cosines["embed_job"]["min"] >= 0.9999, name
        assert cosines["embed_job_onnx_int8"]["mean"] >= 0.97, name
    tokens = result["corpora"]["documents"]["tokens"]
    assert tokens["mean"] > 64 and tokens["at_the_limit"] > 0  # long rows, some cut


@pytest.mark.slow
def test_data_scaling_bench_reports_every_worker_count_and_resume_point(tmp_path):
    """bench/data_scaling.py --quick: one JSON line of the issue's shape; each row read once,
    by the rank that trains it, for every W; a resume deep in a shard of a few hundred bytes."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.data_scaling",
            "--quick",
            "--json",
            "--workdir",
            str(tmp_path),
        ],  # fmt: skip
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout[-3000:]  # the JSON line alone on stdout
    result = json.loads(lines[0])
    assert set(result) == {
        "ranks", "coordinator_row_bytes", "row_bytes", "resume", "shuffle"
    }  # fmt: skip
    assert set(result["ranks"]) == {"1", "2", "4"}
    for world, ranks in result["ranks"].items():
        assert set(ranks) == {"rows_read_per_row", "delivered_per_s", "per_rank_per_s"}, world
        assert ranks["rows_read_per_row"] == 1.0, world  # every row read once, by its rank
        assert ranks["delivered_per_s"] > 0, world
    assert result["coordinator_row_bytes"] == 0  # no process read another rank's rows
    (resume,) = result["resume"].values()
    assert set(resume) == {"state_bytes", "delivered_vs_fresh", "shard_rows", "offset_in_shard"}
    assert resume["offset_in_shard"] >= resume["shard_rows"] // 2  # half-way into the shard
    assert 0 < resume["state_bytes"] <= 65_536
    assert set(result["shuffle"]) >= {"ours", "iid"}
    assert result["shuffle"]["ours"]["labels_per_batch"] > 14  # mixes the 16 files
    assert resume["delivered_vs_fresh"] > 0
