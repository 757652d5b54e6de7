"""The one base of the errors that mean "what the user gave cannot be used": a setting, a path,
an input file, a bucket, a model directory. Every job prints them as one line that names the
thing and exits with the usage-error status (cli.run_job); anything else is a bug and keeps its
traceback. Low in the layers: data/, losses/ and config.py raise subclasses of it."""

from __future__ import annotations


class UserInputError(ValueError):
    """Something the user gave is unusable; the message names it (key, path or file) and says
    what is wrong with it."""
