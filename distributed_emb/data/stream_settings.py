"""What the data path needs from outside the `data` section, resolved once on the driver.

The token shards a run trains from depend on a few settings of other sections: the tokenizer
that makes the ids (the model's) and its maximum length, and where the token cache lives (a
storage location the output settings decide). The training config resolves them once
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
    token_cache_root: str  # data.token_cache_dir, else <storage path>/token_cache, absolute
