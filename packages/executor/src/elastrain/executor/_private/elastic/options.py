"""What both sides of an elastic job agree on: the options the driver hands every worker."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ElasticOptions:
    formation_timeout_s: float  # how long forming a group may take once every member arrived (timeout_s)
    collective_timeout_s: float
    backend: str | None  # None: gloo on CPU, nccl with GPUs
    liveness_timeout_s: float = 8.0  # sets the heartbeat's pace; the driver judges silence
    driver_lease_s: float = 30.0  # a worker stops waiting on a driver that has not polled for this long
    nics: frozenset[str] | None = None  # interfaces gloo and nccl may use
    start_over_on_state_loss: bool = False  # no holder of committed state left, nothing persisted: start over
