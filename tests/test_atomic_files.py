"""Atomic outputs: a crash mid-write leaves the previous file or directory whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distributed_emb import atomic_files
from distributed_emb.atomic_files import replace_directory, staged_directory, write_text_atomic


class Crash(RuntimeError):
    pass


def _leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_write_text_atomic_writes_and_replaces(tmp_path):
    target = tmp_path / "sub" / "metrics.json"
    write_text_atomic(target, '{"a": 1}')
    assert target.read_text() == '{"a": 1}'
    write_text_atomic(target, '{"a": 2}')
    assert target.read_text() == '{"a": 2}'
    assert _leftovers(target.parent) == []


def test_crash_while_writing_keeps_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    target.write_text('{"old": true}')

    def crash(_fd):
        raise Crash("killed during fsync")

    # The temp file has its text but is never synced: the crash lands mid-write.
    monkeypatch.setattr(atomic_files.os, "fsync", crash)
    with pytest.raises(Crash):
        write_text_atomic(target, '{"new": true, "half": ')
    assert target.read_text() == '{"old": true}'
    assert _leftovers(tmp_path) == []  # the temp file is cleaned up


def test_crash_at_the_rename_keeps_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    target.write_text("old")

    def crash(_src, _dst):
        raise Crash("killed before the rename")

    monkeypatch.setattr(atomic_files.os, "replace", crash)
    with pytest.raises(Crash):
        write_text_atomic(target, "new")
    assert target.read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_written_file_honours_the_umask(tmp_path):
    old_umask = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "f.txt", "x")
    finally:
        os.umask(old_umask)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o644


def _model_dir(path, marker):
    path.mkdir()
    (path / "modules.json").write_text(marker)
    (path / "model.safetensors").write_text(marker * 10)


def test_staged_directory_swaps_in_and_deletes_the_old_one(tmp_path):
    final = tmp_path / "model"
    _model_dir(final, "old")
    with staged_directory(final) as staging:
        assert staging.parent == tmp_path and staging.name.startswith(".model.")
        (staging / "modules.json").write_text("new")
    assert (final / "modules.json").read_text() == "new"
    assert not (final / "model.safetensors").exists()  # the new dir, not a merge
    assert _leftovers(tmp_path) == []


def test_crash_while_exporting_keeps_the_previous_directory(tmp_path):
    final = tmp_path / "model"
    _model_dir(final, "old")
    with pytest.raises(Crash):
        with staged_directory(final) as staging:
            (staging / "model.safetensors").write_text("half of the weights")
            raise Crash("killed mid-save")
    assert (final / "modules.json").read_text() == "old"
    assert (final / "model.safetensors").read_text() == "old" * 10
    assert _leftovers(tmp_path) == []


def test_failed_swap_puts_the_previous_directory_back(tmp_path, monkeypatch):
    final = tmp_path / "model"
    _model_dir(final, "old")
    staging = tmp_path / ".model.tmp-x"
    _model_dir(staging, "new")
    real_replace = os.replace

    def replace(src, dst):
        if str(src) == str(staging):
            raise Crash("killed at the swap")
        real_replace(src, dst)

    monkeypatch.setattr(atomic_files.os, "replace", replace)
    with pytest.raises(Crash):
        replace_directory(staging, final)
    assert (final / "modules.json").read_text() == "old"
    assert not any(name.startswith(".model.old-") for name in _leftovers(tmp_path))


def test_replace_directory_creates_a_missing_target(tmp_path):
    staging = tmp_path / ".out.tmp"
    _model_dir(staging, "new")
    replace_directory(staging, tmp_path / "out")
    assert (tmp_path / "out" / "modules.json").read_text() == "new"
    assert not staging.exists()


def test_replace_directory_refuses_a_non_sibling(tmp_path):
    (tmp_path / "a").mkdir()
    staging = tmp_path / "a" / "staged"
    staging.mkdir()
    with pytest.raises(ValueError, match="same directory"):
        replace_directory(staging, tmp_path / "model")


# --- the writers that use them ---------------------------------------------------------------


def test_crashed_model_export_keeps_the_previous_export(tiny_bert_path, tmp_path, monkeypatch):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.model.export import export_sentence_transformer

    encoder = TrainableEncoder(tiny_bert_path, pooler="mean", mlp_head=False)
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_path)
    target = tmp_path / "model"
    export_sentence_transformer(encoder, tokenizer, str(target), 32)
    before = sorted(p.name for p in target.iterdir())
    modules = (target / "modules.json").read_text()

    def crashing_save(self, path, *args, **kwargs):
        (Path(path) / "model.safetensors").write_bytes(b"half")
        raise Crash("killed mid-save")

    monkeypatch.setattr(SentenceTransformer, "save", crashing_save)
    with pytest.raises(Crash):
        export_sentence_transformer(encoder, tokenizer, str(target), 32)
    assert sorted(p.name for p in target.iterdir()) == before
    assert (target / "modules.json").read_text() == modules
    assert _leftovers(tmp_path) == []
    monkeypatch.undo()
    SentenceTransformer(str(target), device="cpu")  # still loads


def test_crashed_infocse_best_round_copy_keeps_the_previous_model(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from distributed_emb.infocse import round_export

    output = tmp_path / "out"
    output.mkdir()
    _model_dir(output / "model", "previous run")
    best_round = tmp_path / "round_2_model"
    _model_dir(best_round, "round 2")
    best = SimpleNamespace(stage="unsupervised", model_dir=str(best_round), round=2, stsb_dev=80.0)

    from distributed_emb.infocse.round_state import RoundState
    from distributed_emb.infocse.rounds_config import InfoCSEConfig

    real_copytree = round_export.shutil.copytree

    def crashing_copytree(src, dst, **kwargs):
        Path(dst, "model.safetensors").write_text("half")
        raise Crash("killed mid-copy")

    monkeypatch.setattr(round_export.shutil, "copytree", crashing_copytree)
    with pytest.raises(Crash):
        round_export.export_best(
            best, output, InfoCSEConfig(), RoundState(str(output), remote=False)
        )
    assert (output / "model" / "modules.json").read_text() == "previous run"
    assert _leftovers(output) == []

    monkeypatch.setattr(round_export.shutil, "copytree", real_copytree)
    round_export.export_best(best, output, InfoCSEConfig(), RoundState(str(output), remote=False))
    assert (output / "model" / "modules.json").read_text() == "round 2"
    assert _leftovers(output) == []
