"""What the driver's core is told about the job, and what it counts while the job runs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CoreConfig:
    min_workers: int
    max_workers: int | None
    reset_limit: int | None
    elastic_timeout: float
    startup_grace_s: float
    arrival_timeout_s: float  # how long a member of a group formed after a failure may take to arrive
    spare_worker: bool = False
    size_multiple: int = 1  # every group's size is a multiple of it; min_workers and max_workers are too


@dataclass
class ElasticStats:
    resets: int = 0
    worlds: list[int] = field(default_factory=list)  # world size of each published world
    spares_used: int = 0  # spare workers that joined on a host Ray placed them on
    evictions: int = 0  # workers stopped because they stopped answering or never arrived
