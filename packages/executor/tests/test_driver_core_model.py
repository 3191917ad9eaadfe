"""Model-based tests of the elastic driver's pure core: hypothesis drives it with random event sequences.

A small simulation stands in for Ray, discovery and the rendezvous actor. It keeps what is in flight (a worker's
start, its call), answers each action the way the Ray shell would, and hands the core events that can really
happen next: a worker ready or failing to start, a call that returns, raises or dies, a rendezvous poll with
failed groups, silent or absent workers, a roll call's answer, hosts that come, go or shrink, time passing, a stop.
After every step the invariants below are checked; the core runs strictly, so an illegal phase transition fails
too. Hypothesis shrinks a failing run and prints its shortest sequence of steps.

``ELASTRAIN_MODEL_EXAMPLES`` sets how many sequences run (CI runs the default, seeded and derandomized).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from elastrain.executor._private.elastic.coordinator import CoordinatorReport
from elastrain.executor._private.elastic.driver import events as ev
from elastrain.executor._private.elastic.driver.config import CoreConfig
from elastrain.executor._private.elastic.driver.core import DriverCore
from elastrain.executor._private.elastic.driver.lifecycle import TERMINAL, JobPhase, WorkerPhase
from elastrain.executor._private.elastic.world import World
from elastrain.executor._private.errors import ElasticJobError, VersionMismatchError

EXAMPLES = int(os.environ.get("ELASTRAIN_MODEL_EXAMPLES", "1500"))
STEPS = 50
GRACE_S = 30.0
ELASTIC_TIMEOUT_S = 60.0
ARRIVAL_S = 10.0
LIVENESS_S = 8.0

# How many sequences and steps ran, for the summary line (conftest prints it).
COUNTS = {"sequences": 0, "steps": 0, "finished": 0, "failed": 0, "publishes": 0, "resets": 0, "held": 0}


@dataclass
class Shell:
    """What the Ray shell would know: calls in flight and what it was told to do."""

    preparing: set[str] = field(default_factory=set)  # spawned; prepare() not answered
    running: set[str] = field(default_factory=set)  # run_elastic() in flight
    stopped: set[str] = field(default_factory=set)  # killed; its call ends with an error
    forgotten: set[str] = field(default_factory=set)
    worlds: list[World] = field(default_factory=list)
    ended: list[ev.Action] = field(default_factory=list)


class DriverCoreMachine(RuleBasedStateMachine):
    @initialize(
        min_workers=st.integers(1, 3),
        extra=st.integers(0, 3),
        unbounded=st.booleans(),
        hosts=st.lists(st.integers(1, 3), min_size=1, max_size=4),
        spare=st.booleans(),
        reset_limit=st.one_of(st.none(), st.integers(1, 6)),
    )
    def start(
        self, min_workers: int, extra: int, unbounded: bool, hosts: list[int], spare: bool, reset_limit: int | None
    ) -> None:
        self.begin(min_workers, None if unbounded else min_workers + extra, hosts, spare, reset_limit, 1)

    def begin(
        self,
        min_workers: int,
        max_workers: int | None,
        hosts: list[int],
        spare: bool,
        reset_limit: int | None,
        multiple: int,
    ) -> None:
        self.config = CoreConfig(
            min_workers=min_workers,
            max_workers=max_workers,
            size_multiple=multiple,
            reset_limit=reset_limit,
            elastic_timeout=ELASTIC_TIMEOUT_S,
            startup_grace_s=GRACE_S,
            arrival_timeout_s=ARRIVAL_S,
            spare_worker=spare,
        )
        self.core = DriverCore(self.config, strict=True)
        self.shell = Shell()
        self.now = 0.0
        self.hosts = {f"h{i}": slots for i, slots in enumerate(hosts)}
        self.next_host = len(hosts)
        self.roll_call_answers: list[int] = []
        self.dead_hosts: set[str] = set()
        self.bad_installs: set[str] = set()  # hosts whose workers run other elastrain versions
        COUNTS["sequences"] += 1
        self.step([self.seen()])

    # -- the step and its invariants ------------------------------------------------------------------------

    def seen(self) -> ev.HostsSeen:
        return ev.HostsSeen(ev.Hosts(dict(self.hosts)))

    def step(self, events: list[ev.Event]) -> None:
        COUNTS["steps"] += 1
        was_terminal = self.core.phase in TERMINAL
        actions = self.core.step(self.now, events)
        if was_terminal:
            assert actions == [], "a finished job emits nothing more"
            return
        while actions:
            action = actions.pop(0)
            answer = self.carry_out(action)
            if answer is not None:
                assert self.core.phase not in TERMINAL
                actions += self.core.step(self.now, [answer])

    def carry_out(self, action: ev.Action) -> ev.Event | None:
        shell = self.shell
        assert not shell.ended, f"{action} after the call ended with {shell.ended[0]}"
        target = getattr(action, "worker_id", None)
        if target is not None and not isinstance(action, ev.Spawn):
            assert target not in shell.forgotten, f"{action} aimed at a forgotten worker"
        if isinstance(action, ev.Spawn):
            assert action.host_id not in self.dead_hosts, f"{action} on a host whose node is gone"
            assert action.host_id not in self.bad_installs, f"{action} on a host with other elastrain versions"
            shell.preparing.add(action.worker_id)
        elif isinstance(action, ev.StartRun):
            assert action.worker_id not in shell.stopped, f"{action} aimed at a stopped worker"
            assert action.worker_id not in shell.preparing
            assert action.worker_id not in shell.running
            shell.running.add(action.worker_id)
        elif isinstance(action, ev.Stop):
            assert action.worker_id not in shell.stopped, f"{action} aimed at a stopped worker"
            shell.stopped.add(action.worker_id)
        elif isinstance(action, ev.Forget):
            shell.forgotten.add(action.worker_id)
            shell.preparing.discard(action.worker_id)
            shell.running.discard(action.worker_id)
        elif isinstance(action, ev.Blacklist) and action.host_id in self.bad_installs:
            self.hosts.pop(action.host_id, None)  # discovery leaves a blacklisted host out
        elif isinstance(action, ev.Publish):
            self.check_published(action.world)
        elif isinstance(action, ev.RollCall):
            return self.answer_roll_call(action)
        elif isinstance(action, ev.Finish | ev.Fail):
            shell.ended.append(action)
            COUNTS["finished" if isinstance(action, ev.Finish) else "failed"] += 1
            if isinstance(action, ev.Fail):
                assert isinstance(action.error, ElasticJobError | RuntimeError)
        return None

    def check_published(self, world: World) -> None:
        worlds = self.shell.worlds
        expected = worlds[-1].generation + 1 if worlds else 1
        assert world.generation == expected, "one group per generation, in order"
        assert world.size >= self.config.min_workers
        if self.config.max_workers is not None:
            leaving = [m for m in world.members if self.phase_of(m.worker_id) is WorkerPhase.LEAVING]
            assert world.size - len(leaving) <= self.config.max_workers
        for member in world.members:
            assert member.worker_id not in self.shell.stopped, "a stopped worker was published"
            assert member.worker_id in self.shell.running, "a member that does not run the job"
            assert self.phase_of(member.worker_id) in (WorkerPhase.MEMBER, WorkerPhase.LEAVING)
        assert sorted(m.slot.rank for m in world.members) == list(range(world.size))
        self.check_blocks(world)
        worlds.append(world)
        COUNTS["publishes"] += 1
        COUNTS["resets"] += len(worlds) > 1

    def check_blocks(self, world: World) -> None:
        """Groups of whole multiples; a block of the previous group that lost nobody is kept whole, and before
        anyone else; the members left out are held, alive, for a later group."""
        multiple = self.config.size_multiple
        assert world.size % multiple == 0, f"a group of {world.size} with size_multiple={multiple}"
        members = {m.worker_id for m in world.members}
        assert not members & set(world.held), "a held worker is also a member"
        COUNTS["held"] += len(world.held)
        for worker_id in world.held:
            assert worker_id in self.shell.running, "a held worker that does not run the job"
            assert self.phase_of(worker_id) is WorkerPhase.READY
            assert any(w.member(worker_id) for w in self.shell.worlds), "held, but never a member"
        if not self.shell.worlds or multiple == 1:
            return
        previous = self.shell.worlds[-1]
        by_rank = sorted(previous.members, key=lambda m: m.slot.rank)
        blocks = [{m.worker_id for m in by_rank[i : i + multiple]} for i in range(0, previous.size, multiple)]
        alive = members | set(world.held)
        intact = [block for block in blocks if block <= alive]
        for block in intact:
            assert block <= members or not block & members, f"block {sorted(block)} was split"
        if any(not block & members for block in intact):
            kept = set().union(*intact)
            assert members <= kept, "a broken block or a newcomer took the place of a whole block"

    def phase_of(self, worker_id: str) -> WorkerPhase | None:
        record = self.core.roster.get(worker_id)
        return record.phase if record is not None else None

    @invariant()
    def every_tracked_worker_will_end(self) -> None:
        """Each worker the core tracks has a call in flight whose end reaches the core, so it is eventually
        stopped or finished; each the shell still calls is tracked."""
        if not hasattr(self, "core") or self.core.phase in TERMINAL:
            return
        for worker in self.core.roster:
            in_flight = worker.worker_id in self.shell.preparing or worker.worker_id in self.shell.running
            assert in_flight, f"{worker} has nothing in flight"
            if worker.phase in (WorkerPhase.SPARE, WorkerPhase.STARTING):
                assert worker.worker_id in self.shell.preparing
            if worker.phase in (WorkerPhase.READY, WorkerPhase.MEMBER, WorkerPhase.LEAVING):
                assert worker.worker_id in self.shell.running
            assert (worker.phase is WorkerPhase.STOPPING) == (worker.worker_id in self.shell.stopped)
        for worker_id in self.shell.preparing | self.shell.running:
            assert self.core.roster.get(worker_id) is not None, f"{worker_id} runs untracked"

    @invariant()
    def phases_agree(self) -> None:
        if not hasattr(self, "core"):
            return
        core = self.core
        if core.phase is JobPhase.STARTING:
            assert core.world is None
        if core.phase in (JobPhase.FORMING, JobPhase.RECOVERING, JobPhase.RUNNING, JobPhase.WAITING):
            assert core.world is not None
        if core.config.max_workers is not None and core.phase not in TERMINAL:
            assert len(core.roster.counted()) <= core.config.max_workers
        if core.phase in TERMINAL:
            assert len(self.shell.ended) == 1
        # The roster's phase index (what each round asks, at any size) agrees with a scan of every worker.
        for phase in WorkerPhase:
            scanned = [w for w in core.roster if w.phase is phase]
            assert core.roster.in_phase(phase) == scanned, phase
            assert core.roster.count(phase) == len(scanned), phase

    # -- what can happen next -------------------------------------------------------------------------------

    def live(self) -> bool:
        return hasattr(self, "core") and self.core.phase not in TERMINAL

    @precondition(lambda self: self.live())
    @rule(seconds=st.sampled_from([0.05, 0.05, 0.05, 0.5, 2.0, GRACE_S / 2 + 1, ARRIVAL_S + 1, ELASTIC_TIMEOUT_S + 1]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self.step([self.seen()])

    @precondition(lambda self: self.live() and bool(self.shell.preparing))
    @rule(
        data=st.data(),
        fails=st.sampled_from([False] * 4 + [True]),
        other_versions=st.sampled_from([False] * 29 + [True]),
    )
    def prepare_answers(self, data: st.DataObject, fails: bool, other_versions: bool) -> None:
        worker_id = data.draw(st.sampled_from(sorted(self.shell.preparing)))
        self.shell.preparing.discard(worker_id)
        if fails or worker_id in self.shell.stopped:
            self.step([self.seen(), ev.PrepareFailed(worker_id, "actor died")])
            return
        record = self.core.roster.get(worker_id)
        assert record is not None
        if other_versions:  # the shell killed it: it runs other elastrain versions than the driver
            before_any_group = self.core.phase is JobPhase.STARTING
            if record.host_id:
                self.bad_installs.add(record.host_id)
            self.step([self.seen(), ev.PrepareFailed(worker_id, "versions differ", incompatible=True)])
            if before_any_group:
                assert self.core.phase is JobPhase.FAILED, "other versions before the first group end the job"
                failed = self.shell.ended[-1]
                assert isinstance(failed, ev.Fail)
                assert isinstance(failed.error, VersionMismatchError)
            return
        # A spare (no host yet) lands where Ray placed it: on a usable host or not.
        node = record.host_id or data.draw(st.sampled_from([*sorted(self.hosts), "elsewhere"]))
        self.step([self.seen(), ev.Prepared(worker_id, node)])

    @precondition(lambda self: self.live() and bool(self.shell.running))
    @rule(
        data=st.data(), how=st.sampled_from(["died", "finished", "removed", "died", "finished", "raised", "node lost"])
    )
    def a_call_ends(self, data: st.DataObject, how: str) -> None:
        worker_id = data.draw(st.sampled_from(sorted(self.shell.running)))
        self.shell.running.discard(worker_id)
        world = self.shell.worlds[-1] if self.shell.worlds else None
        member = world.member(worker_id) if world is not None else None
        record = self.core.roster.get(worker_id)
        seen = self.seen()  # discovery learns of a lost node only at its next poll; the shell asks Ray at once
        if how == "node lost" and record is not None and record.host_id in self.hosts:
            del self.hosts[record.host_id]
            self.dead_hosts.add(record.host_id)
            event: ev.Event = ev.Died(worker_id, "node died", node_lost=True)
        elif worker_id in self.shell.stopped or how == "died":
            event = ev.Died(worker_id, "actor died")
        elif how == "raised" and data.draw(st.sampled_from([False] * 9 + [True])):  # rarely: it ends the sequence
            event = ev.Raised(worker_id, RuntimeError("boom"), "RuntimeError: boom")
        elif how == "finished" and member is not None and world is not None:
            event = ev.Finished(worker_id, world.generation, member.slot.rank, member.slot.rank)
        elif (
            member is None
            and world is not None
            and worker_id not in world.held
            and any(w.member(worker_id) for w in self.shell.worlds)
        ):
            event = ev.Removed(worker_id)  # dropped from the latest group (a held worker waits for a later one)
        else:
            event = ev.Died(worker_id, "actor died")
        self.step([seen, event])

    @precondition(lambda self: self.live() and bool(self.shell.worlds))
    @rule(data=st.data())
    def the_rendezvous_reports(self, data: st.DataObject) -> None:
        world = self.shell.worlds[-1]
        ids = [m.worker_id for m in world.members]
        running = sorted(self.shell.running)
        failures = [
            (w, world.generation, "Connection closed by peer")
            for w in data.draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids)))
        ]
        if data.draw(st.booleans()):  # a stale report from an older group
            failures.append((ids[0], world.generation - 1, "timed out"))
        silent = dict.fromkeys(
            data.draw(st.lists(st.sampled_from([*running, "w999"]), unique=True, max_size=2)), LIVENESS_S + 1
        )
        missing = None
        if data.draw(st.booleans()):
            absent = tuple(data.draw(st.lists(st.sampled_from(ids), unique=True, min_size=1, max_size=len(ids))))
            missing = (world.generation, data.draw(st.sampled_from([0.1, ARRIVAL_S + 1])), absent)
        self.step([self.seen(), ev.Polled(CoordinatorReport(failures, silent, missing))])

    def answer_roll_call(self, action: ev.RollCall) -> ev.Event:
        assert set(action.members) - action.reporters, "a roll call with nobody to ask"
        for worker_id in action.members:
            assert self.phase_of(worker_id) is WorkerPhase.MEMBER
        choice = self.roll_call_answers.pop(0) if self.roll_call_answers else 0
        others = tuple(sorted(set(action.members) - action.reporters))
        if choice == 1:
            return ev.RollCallDone(death_on_its_way=True)
        return ev.RollCallDone(False, others[: choice // 2], 0.3)

    @precondition(lambda self: self.live())
    @rule(answers=st.lists(st.integers(0, 5), max_size=3))
    def roll_calls_will_answer(self, answers: list[int]) -> None:
        """How the next roll calls go: 0 every member lives; 1 a death on its way; more: some did not answer."""
        self.roll_call_answers = list(answers)

    @precondition(lambda self: self.live())
    @rule(slots=st.integers(1, 3))
    def a_host_joins(self, slots: int) -> None:
        self.hosts[f"h{self.next_host}"] = slots
        self.next_host += 1
        self.step([self.seen()])

    @precondition(lambda self: self.live() and bool(self.hosts))
    @rule(data=st.data(), slots=st.integers(0, 2))
    def a_host_shrinks_or_goes(self, data: st.DataObject, slots: int) -> None:
        host = data.draw(st.sampled_from(sorted(self.hosts)))
        if slots >= self.hosts[host]:
            return
        if slots:
            self.hosts[host] = slots
        else:
            del self.hosts[host]
        self.step([self.seen(), ev.HostShrunk(host, slots)])

    @precondition(lambda self: self.live())
    @rule(stop=st.sampled_from([False] * 9 + [True]))
    def someone_stops_the_call(self, stop: bool) -> None:
        if stop:  # rarely: it ends the sequence
            self.step([ev.StopRequested("the executor was shut down")])

    @precondition(lambda self: hasattr(self, "core") and not self.live())
    @rule()
    def nothing_after_the_end(self) -> None:
        self.now += 1.0
        self.step([self.seen(), ev.StopRequested("again")])


class BlocksMachine(DriverCoreMachine):
    """The same job in groups of whole blocks (``size_multiple``), sized so that several blocks form often."""

    @initialize(
        multiple=st.sampled_from([2, 2, 3]),
        blocks=st.integers(1, 2),
        extra=st.integers(0, 2),
        hosts=st.lists(st.integers(1, 3), min_size=2, max_size=5),
        spare=st.booleans(),
    )
    def start(self, multiple: int, blocks: int, extra: int, hosts: list[int], spare: bool) -> None:  # type: ignore[override]
        self.begin(blocks * multiple, (blocks + extra) * multiple, hosts, spare, None, multiple)


_SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
DriverCoreMachine.TestCase.settings = _SETTINGS
TestDriverCore = DriverCoreMachine.TestCase
BlocksMachine.TestCase.settings = settings(_SETTINGS, max_examples=max(EXAMPLES // 6, 1))
TestDriverCoreBlocks = BlocksMachine.TestCase


@pytest.fixture(autouse=True, scope="module")
def _quiet_driver() -> Iterator[None]:
    logger = logging.getLogger("elastrain.executor")
    level, logger.level = logger.level, logging.ERROR  # thousands of sequences of deaths and evictions
    yield
    logger.setLevel(level)


def summary() -> str:
    """The line conftest prints at the end of the run."""
    return (
        "driver core model: {sequences} sequences, {steps} steps, {publishes} groups published, {resets} resets, "
        "{finished} finished, {failed} failed, {held} workers held (size_multiple)"
    ).format(**COUNTS)
