"""How tests start things: one place for each, shared by every module.

- `local_ray`: one local Ray for the whole session (the `ray_local` fixture in conftest.py),
  with a check after each test that every CPU is free again.
- `ray_head`: a throwaway `ray start --head` on loopback (job submission, token auth).
- `autoscaling_cluster`: a fake autoscaling multi-node cluster that stops only its own processes.
- `s3`: an S3-protocol server on 127.0.0.1 (the session-scoped `s3` fixture).
- `jobs`: the files in jobs/ as tests run them (`run(name, argv)`, `checked_config`).
- `tiny_run`: the tiny corpus and training config, and the finished tiny runs that many
  tests assert against (session fixtures in conftest.py).

tests/README.md says which fixture to use for what and what a new test may cost.
"""
