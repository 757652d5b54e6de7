"""Hyperparameter search over the training job with Ray Tune (see docs/TUNE.md).

Lives in the checkout next to jobs/ (not installed with distributed_emb): run it from the
repository root, or through jobs/tune_informin.py, which puts the checkout on sys.path.
"""
