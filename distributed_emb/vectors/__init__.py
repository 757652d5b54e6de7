"""Vectors of a corpus: embed it into Parquet shards (corpus_embedding.py), index, search and
mine them. The shard layout every step reads and writes is in shard_layout.py."""
