"""MTEB hand-off: a clear error without mteb, and the right calls with it (faked here)."""

from __future__ import annotations

import sys
import types

import pytest

from distributed_emb.evaluation.mteb_handoff import import_mteb, run_mteb


def test_missing_mteb_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mteb", None)  # makes `import mteb` fail
    with pytest.raises(ImportError, match=r"pip install 'distributed_emb\[mteb\]'"):
        import_mteb()


def test_run_mteb_passes_our_model_and_tasks(monkeypatch, tiny_bert_path):
    calls = {}
    fake = types.ModuleType("mteb")
    fake.get_tasks = lambda tasks: [f"task:{t}" for t in tasks]

    def evaluate(model, tasks, encode_kwargs):
        calls.update(model=model, tasks=tasks, encode_kwargs=encode_kwargs)
        return "results"

    fake.evaluate = evaluate
    monkeypatch.setitem(sys.modules, "mteb", fake)
    assert run_mteb(tiny_bert_path, ["STS12"], pooler="mean", batch_size=8) == "results"
    assert calls["tasks"] == ["task:STS12"] and calls["encode_kwargs"] == {"batch_size": 8}
    # The model handed over is a SentenceTransformer with our pooler on top.
    assert calls["model"].encode(["a test"]).shape == (1, 32)
    assert "'pooling_mode': 'mean'" in repr(calls["model"][1])
