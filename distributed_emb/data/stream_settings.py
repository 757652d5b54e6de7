"""What the data path needs from outside the `data` section, resolved once on the driver.

The stream of a run depends on a few settings of other sections: the tokenizer that makes the
ids (the model's), the global batch that cuts it, whether the schedule needs a row count,
whether the run has GPUs (where `data.tokenize_in=auto` tokenises), and where the token cache
lives (a storage location the output settings decide). The training config resolves them once
(`TrainingConfig.stream_settings()`, config.py) and data/ takes this frozen record with its own
`DataConfig`, so no function in data/ reads another section.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StreamSettings:
    tokenizer: str  # the model path or hub name whose tokenizer makes the ids
    max_seq_length: int  # ids per row, special tokens included
    trust_remote_code: bool  # the tokenizer may run the model directory's code
    global_batch: int  # rows of one micro-step over the whole group (any W)
    max_steps: int | None  # set: the run's length is steps, and the corpus is not counted
    use_gpu: bool  # data.tokenize_in=auto tokenises in Ray Data on GPU runs
    token_cache_root: str  # data.token_cache_dir, else <storage path>/token_cache, absolute
