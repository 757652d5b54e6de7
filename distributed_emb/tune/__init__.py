"""Hyperparameter search over the training job with Ray Tune (see docs/TUNE.md).

Installed with the package; `jobs/tune_informin.py` is the entry point.
"""
