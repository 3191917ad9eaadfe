"""What goes into the driver's core (events) and what comes out of it (actions): plain values, no Ray.

The Ray shell (``shell.py``) turns what Ray, discovery and the rendezvous actor tell it into events, calls
``DriverCore.step(now, events)``, and carries out the actions in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elastrain.executor._private.elastic.coordinator import CoordinatorReport
from elastrain.executor._private.elastic.world import World

# -- events ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hosts:
    """The usable hosts as discovery reports them now: slots by host, in first-seen order, and the blacklisted."""

    slots: Mapping[str, int]
    blacklisted: frozenset[str] = frozenset()


@dataclass(frozen=True)
class HostsSeen:
    """Discovery's current view (sent whenever it may have changed; the core keeps the latest)."""

    hosts: Hosts


@dataclass(frozen=True)
class HostShrunk:
    """A host went away or lost slots: members beyond its slots leave at their next commit."""

    host_id: str
    slots: int


@dataclass(frozen=True)
class Prepared:
    """A worker's actor started and imported what it needs, on node ``node_id``."""

    worker_id: str
    node_id: str


@dataclass(frozen=True)
class PrepareFailed:
    """A worker's start failed; ``incompatible``: it runs other elastrain versions than the driver."""

    worker_id: str
    reason: str
    incompatible: bool = False


@dataclass(frozen=True)
class Finished:
    """A worker's function returned ``value`` as rank ``rank`` of group ``generation`` (0: not under elastic.run)."""

    worker_id: str
    generation: int
    rank: int
    value: Any


@dataclass(frozen=True)
class Removed:
    """A worker left out of the next group stopped without a result."""

    worker_id: str


@dataclass(frozen=True)
class Died:
    """A worker's actor died (killed, out of memory, its node lost) while its call ran."""

    worker_id: str
    reason: str
    node_lost: bool = False  # its node is gone too (the shell asked Ray before handing the death over)


@dataclass(frozen=True)
class Raised:
    """A worker's function raised: the job fails with ``error`` (already the error the user should see)."""

    worker_id: str
    error: BaseException
    detail: str  # one line for the run's observers


@dataclass(frozen=True)
class Polled:
    """What the rendezvous actor reported at the shell's last poll."""

    report: CoordinatorReport


@dataclass(frozen=True)
class RollCallDone:
    """The answer to a :class:`RollCall`."""

    death_on_its_way: bool  # a member's call ended meanwhile: Ray knows it died, and says so next
    gone: tuple[str, ...] = ()  # members that did not answer in time (lost with their node)
    waited_s: float = 0.0


@dataclass(frozen=True)
class StopRequested:
    reason: str


Event = (
    HostsSeen | HostShrunk | Prepared | PrepareFailed | Finished | Removed | Died | Raised | Polled | RollCallDone
) | StopRequested

# -- actions -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spawn:
    """Start a worker pinned to ``host_id`` (or, with ``host_id`` "", a spare Ray places where it can)."""

    worker_id: str
    host_id: str


@dataclass(frozen=True)
class StartRun:
    """Call the job's function on a prepared worker."""

    worker_id: str


@dataclass(frozen=True)
class Stop:
    """Kill a worker; ``unresponsive``: it may not answer (frozen, hung), so kill its process on its node too."""

    worker_id: str
    unresponsive: bool = False


@dataclass(frozen=True)
class Forget:
    """The worker's call ended: drop its handle (kept for the final clean-up)."""

    worker_id: str


@dataclass(frozen=True)
class WorkerFailed:
    """The job counts this worker as failed; ``check_node``: the shell blacklists its host if the node is gone
    (False where the core already knows it is)."""

    worker_id: str
    host_id: str
    reason: str
    check_node: bool = True


@dataclass(frozen=True)
class Blacklist:
    host_id: str


@dataclass(frozen=True)
class Publish:
    world: World
    resets: int


@dataclass(frozen=True)
class RollCall:
    """Ask every member whether it lives: ``reporters`` reported the failure; ``members`` are all of them."""

    reporters: frozenset[str]
    members: tuple[str, ...]


@dataclass(frozen=True)
class ForgetBeats:
    worker_ids: tuple[str, ...]


@dataclass(frozen=True)
class Exited:
    """Tell the run's observers that a member of the current group crashed or was let go."""

    worker_id: str
    status: str  # CRASHED or REMOVED
    detail: str


@dataclass(frozen=True)
class RunEvent:
    """An event of the run that a worker reported (say, a start-over after state was lost)."""

    kind: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Finish:
    """The call ends with these results (every worker is stopped)."""

    results: tuple[Any, ...]


@dataclass(frozen=True)
class Fail:
    """The call ends with this error (every worker is stopped)."""

    error: BaseException


Action = (Spawn | StartRun | Stop | Forget | WorkerFailed | Blacklist | Publish | RollCall | ForgetBeats | Exited) | (
    RunEvent | Finish | Fail
)
