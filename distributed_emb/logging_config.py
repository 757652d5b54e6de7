"""What a run reports and where (`logging.*`): console, TensorBoard, W&B, MLflow."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from distributed_emb.settings import section


@section
class LoggingConfig:
    tensorboard: Annotated[
        bool,
        Field(description="event files in <output.dir>/tensorboard/, written by rank 0"),
    ] = True
    wandb: Annotated[
        bool,
        Field(
            description="Weights & Biases through Ray's setup_wandb (needs wandb and an API key)"
        ),
    ] = False
    mlflow: Annotated[
        bool,
        Field(description="MLflow through Ray's setup_mlflow (MLFLOW_TRACKING_URI or a file)"),
    ] = False
    logging_steps: Annotated[
        int,
        Field(
            ge=1,
            description="a progress line (console, run.log, train_log.jsonl, the trackers) "
            "every N steps",
        ),
    ] = 10
    # Redrawn into a log file, each redraw would become a line.
    progress_bar: Annotated[
        Literal["auto", "on", "off"],
        Field(
            description="progress of training and of every long piece of work (embedding, "
            "annotation, evaluation, the token cache, trials): auto: a bar on a terminal, "
            "else a line at most a minute; on: the bar; off: neither"
        ),
    ] = "auto"
