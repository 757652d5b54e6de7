"""The training job's summary on the console (distributed_emb/train/driver.py)."""

from distributed_emb.selection import given_model_line
from distributed_emb.train.driver import summarise_run


def _metrics(**extra):
    return {"model_dir": "out/model", "select_by": "stsb_dev", "best_step": 0,
            "stsb_dev_before": 80.0, "stsb_dev_best": 80.0, **extra}  # fmt: skip


def test_a_run_that_hands_back_the_given_model_says_so_in_exactly_one_line():
    line = given_model_line("STS-B dev Spearman", {"step": 20, "select_score": 79.0}, 80.0)
    summary = summarise_run(_metrics(exported=line)).splitlines()
    assert [row for row in summary if "given model" in row] == [line]
    assert line == (
        "exported: the given model unchanged — no trained step beat it on STS-B dev Spearman "
        "(best trained 79.00 at step 20 vs 80.00 at the start)"
    )
    trained = summarise_run(_metrics(exported="step 20", best_step=20))
    assert "given model" not in trained and "exported:" not in trained
