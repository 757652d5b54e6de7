"""Export round trip: the saved SentenceTransformer gives the vectors of encoder + head."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from distributed_emb.mcr2.export import export_compressed_model
from distributed_emb.mcr2.head import CompressionHead

SENTENCES = ["A man is playing a guitar.", "The cat sits on the mat.", "Stocks fell sharply."]


@pytest.mark.parametrize("activation,hidden", [("gelu", (24,)), ("tanh", (20, 12))])
def test_export_round_trip_gives_the_same_vectors(tmp_path, tiny_bert_path, activation, hidden):
    from distributed_emb.evaluation.encode import local_encode

    torch.manual_seed(0)
    head = CompressionHead(32, 8, hidden_dims=hidden, activation=activation).eval()
    path = export_compressed_model(
        tmp_path / "model",
        tiny_bert_path,
        head,
        pooler="mean",
        max_seq_length=32,
        metadata={"stsb_dev": 1.5},
    )

    base = local_encode(SENTENCES, tiny_bert_path, pooler="mean", max_seq_length=32)  # (3, 32)
    with torch.no_grad():
        expected = head(torch.from_numpy(base)).numpy()  # (3, 8)

    # Loaded in a fresh interpreter that never imports distributed_emb.
    script = (
        "import json, sys\n"
        "from sentence_transformers import SentenceTransformer\n"
        f"model = SentenceTransformer({str(path)!r}, device='cpu')\n"
        f"vectors = model.encode({SENTENCES!r})\n"
        "assert 'distributed_emb' not in sys.modules\n"
        "print(json.dumps(vectors.tolist()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    reloaded = np.array(json.loads(result.stdout.strip().splitlines()[-1]))
    assert reloaded.shape == (3, 8)
    np.testing.assert_allclose(reloaded, expected, rtol=1e-4, atol=1e-5)
    info = json.loads((path / "mcr2_head.json").read_text())
    assert info["output_dim"] == 8 and info["stsb_dev"] == 1.5
    assert info["hidden_dims"] == list(hidden) and info["activation"] == activation
