"""distributed_emb: Ray-native unsupervised sentence-embedding training."""

__version__ = "0.1.0"
