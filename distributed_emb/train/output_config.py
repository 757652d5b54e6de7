"""Where a training run writes (`output.*`): its directory, Ray Train storage, run name, resume."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from distributed_emb.settings import section


@section
class OutputConfig:
    dir: Annotated[
        str,
        Field(description="where model/, metrics.json, run.log and train_log.jsonl go"),
    ] = "outputs/informin"
    checkpoints_to_keep: Annotated[
        int, Field(ge=1, description="Ray Train checkpoints kept (the best by STS-B dev)")
    ] = 2
    storage_path: Annotated[
        str | None,
        Field(
            description="Ray Train storage: s3://, gs:// or a local path; null: under output.dir"
        ),
    ] = None
    run_name: Annotated[
        str | None, Field(description="Ray Train run name (also the trackers' run name)")
    ] = None
    # train/run_identity.py.
    resume: Annotated[
        Literal["auto", "must", "anyway", "overwrite"],
        Field(
            description="an earlier run under the same run name: auto continues it when its "
            "settings match and refuses otherwise; must (--resume) requires one; anyway "
            "(--resume-anyway) continues it with other settings; overwrite (--overwrite) "
            "deletes it and starts again"
        ),
    ] = "auto"
    row_log: Annotated[
        bool,
        Field(
            description="audit trail: each rank appends the row ids of every batch it trains "
            "on to <output.dir>/trained_rows/rank<r>.jsonl"
        ),
    ] = False
