"""The Ray a job joins or starts (`ray.*`), shared by every job."""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import Field

from distributed_emb.checks import require_range
from distributed_emb.settings import section

# Ray refuses a smaller object store (ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES).
MIN_OBJECT_STORE_MB = 75


def _physical_memory_mb() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024**2
    except (AttributeError, ValueError, OSError):  # not POSIX: no bound
        return None


def validate_ray_config(ray: RayConfig, prefix: str = "ray") -> None:
    """The object store of a Ray started here (ignored when joining a cluster) cannot exceed
    this machine's memory; a value in bytes instead of MiB is the usual way to get there. Its
    lower bound is declared."""
    memory = _physical_memory_mb()
    if memory is not None and ray.object_store_memory_mb is not None:
        require_range(
            ray.object_store_memory_mb,
            f"{prefix}.object_store_memory_mb",
            MIN_OBJECT_STORE_MB,
            memory,
            why=f"MiB, at most this machine's {memory} MiB of memory; null lets Ray choose",
        )


@section
class RayConfig:
    address: Annotated[
        str | None,
        Field(description="the Ray cluster to join; null: RAY_ADDRESS if set, else start one here"),
    ] = None
    num_cpus: Annotated[
        int | None,
        Field(ge=1, description="logical CPUs of a Ray started here; null: the machine's cores"),
    ] = None
    # Its upper bound, this machine's memory: validate_ray_config.
    object_store_memory_mb: Annotated[
        int | None,
        Field(
            ge=MIN_OBJECT_STORE_MB,
            description="object store of a Ray started here, in MiB (at least Ray's minimum); "
            "null: Ray chooses",
        ),
    ] = 1024
