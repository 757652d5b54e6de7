"""The training loop's settings (`train.*`, `train.deepspeed.*`): workers, engine, precision,
batch, optimiser, schedule, failures."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from pydantic import Field

from distributed_emb.checks import require as _require
from distributed_emb.checks import require_range
from distributed_emb.settings import Seed, section


@section
class DeepSpeedConfig:
    zero_stage: Annotated[int, Field(ge=0, le=3, description="DeepSpeed ZeRO stage")] = 2
    config_path: Annotated[
        str | None, Field(description="a DeepSpeed JSON whose keys override ours")
    ] = None
    # DeepSpeed checkpoints are pickles: by default they are restored with
    # torch.load(weights_only=True) and a short allowlist of plain-data DeepSpeed classes.
    trust_checkpoints: Annotated[
        bool,
        Field(
            description="restore DeepSpeed checkpoints with full unpickling (can run code): "
            "only for checkpoints you wrote yourself"
        ),
    ] = False


@section
class TrainLoopConfig:
    # Ray Train's elastic worker groups. The global batch G stays `batch_size × max` whatever the
    # group's size W, which need not divide it: the first G % W workers take ⌈G/W⌉ rows, the
    # others ⌊G/W⌋ (data/epoch_plan.py split_rows), and the loss is weighted so training
    # equals one process on all G rows (train/step.py rank_weight). A worker's memory is bounded
    # by the ⌈G/min⌉ rows it holds in the smallest group; GradCache (train.mini_batch_size) caps
    # the activation memory at one mini-batch's whatever the slice (only the (B, d) cached
    # embeddings and the (B, G) logits grow with it).
    num_workers: Annotated[
        int | list[int],
        Field(
            description="Ray Train workers (one per GPU), or [min, max] for an elastic group "
            "that starts once min fit, grows as nodes arrive and shrinks when one is lost"
        ),
    ] = 2
    elastic_resize_interval_s: Annotated[
        float,
        Field(
            gt=0,
            description="how often an elastic group checks whether more workers fit; growing "
            "restarts the group from its last checkpoint",
        ),
    ] = 60.0
    use_gpu: Annotated[bool, Field(description="one GPU per worker")] = False
    cpus_per_worker: Annotated[float, Field(gt=0, description="CPUs each worker reserves")] = 1.0
    engine: Annotated[
        Literal["ddp", "deepspeed"],
        Field(description="DDP, or DeepSpeed ZeRO (pip install -e '.[deepspeed]')"),
    ] = "ddp"
    # train/precision.py; the losses stay fp32.
    precision: Annotated[
        Literal["auto", "fp32", "bf16", "fp16"],
        Field(
            description="training precision (fp16 only on GPUs); auto: bf16 autocast where it "
            "is faster (GPUs with bf16, CPUs that measure faster at start-up), else fp32"
        ),
    ] = "fp32"
    # train/layout.py.
    layout: Annotated[
        Literal["auto", "as_set"],
        Field(
            description="how the global batch is laid out over processes: as_set, exactly "
            "num_workers × batch_size; auto (one node): one worker holding the whole global "
            "batch with every core on a CPU node, one worker per GPU on a GPU node"
        ),
    ] = "as_set"
    # On a 2-core CPU it measured 0.97x eager after 50-100 s of compiling (docs/BENCHMARKS.md);
    # the gain it exists for is on GPUs (bench/gpu_check.sh measures it). Batches are padded to
    # a multiple of 8 tokens so the compiled graph meets few shapes.
    compile: Annotated[
        bool,
        Field(
            description="torch.compile the encoder: faster steps on GPUs, after minutes of "
            "compiling"
        ),
    ] = False
    batch_size: Annotated[
        int,
        Field(
            ge=2,
            description="rows per worker per step (at the largest group; in-batch negatives: "
            "the global batch is num_workers × this)",
        ),
    ] = 32
    mini_batch_size: Annotated[
        int | None,
        Field(
            ge=1,
            description="GradCache: embed in mini-batches of this size to cap memory, at most "
            "train.batch_size; null: one pass",
        ),
    ] = None
    gradient_accumulation_steps: Annotated[
        int, Field(ge=1, description="batches per optimizer step")
    ] = 1
    learning_rate: Annotated[
        float, Field(gt=0, description="peak AdamW learning rate (linear decay)")
    ] = 3e-5
    weight_decay: Annotated[float, Field(ge=0, description="AdamW weight decay")] = 0.0
    warmup_ratio: Annotated[
        float, Field(ge=0, lt=1, description="share of the steps with a linear warm-up")
    ] = 0.0
    min_learning_rate_ratio: Annotated[
        float,
        Field(
            ge=0,
            le=1,
            description="where the linear decay ends, as a share of train.learning_rate "
            "(0: decays to 0; 1: constant after the warm-up)",
        ),
    ] = 0.0
    # clip_grad_norm_ scales gradients by max_norm / norm: a negative bound reverses them
    # (training climbs the loss) and 0 zeroes them.
    max_grad_norm: Annotated[
        float | None, Field(gt=0, description="gradient clipping bound; null: no clipping")
    ] = 1.0
    epochs: Annotated[int, Field(ge=1, description="passes over the corpus")] = 1
    max_steps: Annotated[
        int | None, Field(ge=1, description="stop after this many optimizer steps")
    ] = None
    seed: Annotated[Seed, Field(description="seed of the model, dropout and data order")] = 42
    torch_threads: Annotated[
        int | None,
        Field(ge=1, description="torch threads per worker; null: cpus_per_worker, rounded up"),
    ] = None
    # Resolved by train/resolved_run.py (resolve_max_failures) before the run starts.
    max_failures: Annotated[
        int | None,
        Field(
            ge=-1,
            description="worker-group restarts from the last checkpoint before the run fails "
            "(-1: unlimited); null: auto, 3 on a cluster (RAY_ADDRESS / ray.address) or with "
            "s3:// / gs:// output.storage_path, 0 on one machine",
        ),
    ] = None
    report_steps: Annotated[
        int | None,
        Field(
            ge=1,
            description="also evaluate STS-B dev and write a checkpoint every N steps; null: "
            "only at eval.eval_steps",
        ),
    ] = None
    # The resource plan (resource_plan.py) checks the cluster holds both these and the workers.
    data_cpus: Annotated[
        float,
        Field(
            ge=1,
            description="CPUs kept free of Train workers for Ray Data's read/clean/feed tasks "
            "(whole CPUs: each task takes one)",
        ),
    ] = 1.0
    lower_cpus_to_fit: Annotated[
        bool,
        Field(
            description="when the cluster's CPUs cannot hold the workers plus train.data_cpus, "
            "reserve a smaller CPU share per worker (at least 0.25; torch threads unchanged) "
            "instead of failing"
        ),
    ] = True
    # A pipeline that can never be scheduled, or nodes that never come.
    stall_timeout_s: Annotated[
        float | None,
        Field(
            gt=0,
            description="fail the run when a task, actor or worker group of the job has waited "
            "this long for resources; null: never",
        ),
    ] = 600.0
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, (list, tuple))

    @property
    def min_workers(self) -> int:
        return self.num_workers[0] if self.elastic else self.num_workers

    @property
    def max_workers(self) -> int:
        return self.num_workers[-1] if self.elastic else self.num_workers

    @property
    def global_batch(self) -> int:
        """Rows of one micro-step over the whole group, the same for every group size."""
        return self.max_workers * self.batch_size

    def worker_counts(self) -> range:
        return range(self.min_workers, self.max_workers + 1)


def validate_worker_counts(t: TrainLoopConfig) -> None:
    """`train.num_workers`: a count, or [min, max]; any size in the range trains the global batch
    (its workers take ⌊G/W⌋ or ⌈G/W⌉ rows: data/epoch_plan.py split_rows)."""
    if not t.elastic:
        require_range(t.num_workers, "train.num_workers", 1)
        return
    _require(
        len(t.num_workers) == 2 and 1 <= t.num_workers[0] <= t.num_workers[1],
        "train.num_workers",
        f"{list(t.num_workers)}: a range is [min, max] with 1 <= min <= max",
    )
