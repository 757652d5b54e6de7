"""Export round trip: the saved SentenceTransformer gives the vectors of encoder + head."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import torch

from distributed_emb.mcr2.export_with_head import export_compressed_model
from distributed_emb.model.compression_head import CompressionHead

SENTENCES = ["A man is playing a guitar.", "The cat sits on the mat.", "Stocks fell sharply."]
HEADS = {"linear": ((), "gelu"), "mlp-gelu": ((24,), "gelu"), "mlp-tanh": ((20, 12), "tanh")}


def test_export_round_trip_gives_the_same_vectors(tmp_path, tiny_bert_path):
    from distributed_emb.model.embedder import local_encode

    base = local_encode(SENTENCES, tiny_bert_path, pooler="mean", max_seq_length=32)  # (3, 32)
    expected, paths = {}, {}
    for name, (hidden, activation) in HEADS.items():
        torch.manual_seed(len(hidden))
        head = CompressionHead(32, 8, hidden_dims=hidden, activation=activation).eval()
        with torch.no_grad():
            expected[name] = head(torch.from_numpy(base)).numpy()  # (3, 8)
        paths[name] = str(
            export_compressed_model(
                tmp_path / name, tiny_bert_path, head, pooler="mean", max_seq_length=32,
                metadata={"stsb_dev": 1.5},
            )
        )  # fmt: skip
        info = json.loads((tmp_path / name / "mcr2_head.json").read_text())
        assert info["output_dim"] == 8 and info["stsb_dev"] == 1.5
        assert info["hidden_dims"] == list(hidden) and info["activation"] == activation

    # Loaded in a fresh interpreter that never imports distributed_emb.
    script = (
        "import json, sys\n"
        "from sentence_transformers import SentenceTransformer\n"
        f"paths = {paths!r}\n"
        "out = {name: SentenceTransformer(path, device='cpu')"
        f".encode({SENTENCES!r}).tolist() for name, path in paths.items()}}\n"
        "assert 'distributed_emb' not in sys.modules\n"
        "print(json.dumps(out))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    reloaded = json.loads(result.stdout.strip().splitlines()[-1])
    for name in HEADS:
        got = np.array(reloaded[name])
        assert got.shape == (3, 8)
        np.testing.assert_allclose(got, expected[name], rtol=1e-4, atol=1e-5)
