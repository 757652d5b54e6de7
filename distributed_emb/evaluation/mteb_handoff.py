"""Optional hand-off to MTEB for users who have its data (``pip install 'distributed_emb[mteb]'``).

MTEB downloads its datasets from the Hugging Face Hub, so this needs network access (or a
warm HF cache) that our own evaluator does not. The model is loaded exactly as the evaluator
loads it (:func:`load_sentence_transformer`, same pooler), so the numbers are for the same
embedding function.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distributed_emb.model.sentence_transformer import load_sentence_transformer


def import_mteb():
    """``import mteb``, or an ImportError that says how to get it."""
    try:
        import mteb  # optional
    except ImportError:
        raise ImportError(
            "the MTEB hand-off needs the optional 'mteb' package: "
            "pip install 'distributed_emb[mteb]' (or pip install mteb)"
        ) from None
    return mteb


def run_mteb(
    model_path: str,
    tasks: Sequence[str],
    output_folder: str | None = None,
    pooler: str | None = None,
    batch_size: int = 128,
    max_seq_length: int | None = None,
) -> Any:
    """Evaluate `model_path` on the named MTEB `tasks` (e.g. ``["STS12", "SICK-R"]``).

    Works with mteb 2.x (``mteb.evaluate``) and 1.x (``mteb.MTEB(...).run``); returns what
    that version returns. `output_folder` is where mteb 1.x writes its JSON results.
    """
    mteb = import_mteb()
    model = load_sentence_transformer(model_path, pooler=pooler, max_seq_length=max_seq_length)
    selected = mteb.get_tasks(tasks=list(tasks))
    encode_kwargs = {"batch_size": batch_size}
    if hasattr(mteb, "evaluate"):  # mteb >= 2
        return mteb.evaluate(model, tasks=selected, encode_kwargs=encode_kwargs)
    evaluation = mteb.MTEB(tasks=selected)
    return evaluation.run(model, output_folder=output_folder, encode_kwargs=encode_kwargs)
