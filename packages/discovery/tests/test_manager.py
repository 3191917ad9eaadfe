"""HostManager: polling, change events, waiting for slots, blacklisting in real time."""

from __future__ import annotations

import threading
import time

import pytest

from elastrain.discovery import (
    AllHostsBlacklistedError,
    HostChange,
    HostDiscovery,
    HostEvent,
    HostManager,
    HostManagerStoppedError,
    StaticHostDiscovery,
)
from elastrain_testutils.waiting import wait_until


class FlakyDiscovery(HostDiscovery):
    """Succeeds with the given hosts until told to fail."""

    def __init__(self, hosts: dict[str, int]) -> None:
        self.hosts = hosts
        self.error: Exception | None = None

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        if self.error is not None:
            raise self.error
        return dict(self.hosts)


def changes(events: list[HostEvent]) -> list[tuple[str, str, int, int]]:
    return [(e.change.value, e.host_id, e.old_slots, e.new_slots) for e in events]


def test_refresh_reports_added_removed_and_slot_changes() -> None:
    discovery = StaticHostDiscovery("h1:2")
    manager = HostManager(discovery)
    assert changes(manager.refresh()) == [("added", "h1", 0, 2)]
    assert manager.refresh() == []
    generation = manager.generation

    discovery.set_hosts("h1:4,h2:1,h3:1")
    assert changes(manager.refresh()) == [
        ("slots_changed", "h1", 2, 4),
        ("added", "h2", 0, 1),
        ("added", "h3", 0, 1),
    ]
    assert manager.generation == generation + 1
    assert manager.available_slots == 6

    discovery.set_hosts("h2:1")
    assert changes(manager.refresh()) == [("removed", "h1", 4, 0), ("removed", "h3", 1, 0)]
    assert list(manager.current_hosts) == ["h2"]


def test_hosts_keep_first_seen_order() -> None:
    discovery = StaticHostDiscovery("h3:1,h1:1")
    manager = HostManager(discovery)
    manager.refresh()
    discovery.set_hosts("h0:1,h1:1,h3:1")  # a discovery that returns hosts in another order
    manager.refresh()
    assert list(manager.current_hosts) == ["h3", "h1", "h0"]


def test_background_polling_notifies_listeners() -> None:
    discovery = StaticHostDiscovery("h1:1")
    seen: list[HostEvent] = []
    with HostManager(discovery, poll_interval_s=0.02) as manager:
        manager.add_listener(seen.extend)
        generation = manager.generation
        discovery.set_hosts("h1:1,h2:2")
        assert manager.wait_for_change(generation, timeout_s=5) == generation + 1
        wait_until(lambda: seen, timeout_s=5, what="listener call")
        assert changes(seen) == [("added", "h2", 0, 2)]


def test_listener_that_raises_is_kept(caplog: pytest.LogCaptureFixture) -> None:
    discovery = StaticHostDiscovery("h1:1")
    manager = HostManager(discovery)
    calls: list[int] = []

    def broken(events: list[HostEvent]) -> None:
        calls.append(len(events))
        raise RuntimeError("listener bug")

    remove = manager.add_listener(broken)
    manager.refresh()
    discovery.set_hosts("h2:1")
    manager.refresh()
    assert calls == [1, 2]
    assert "listener raised" in caplog.text
    remove()
    discovery.set_hosts("h3:1")
    manager.refresh()
    assert calls == [1, 2]


def test_wait_for_change_times_out_with_the_same_generation() -> None:
    manager = HostManager(StaticHostDiscovery("h1:1"))
    manager.refresh()
    assert manager.wait_for_change(manager.generation, timeout_s=0.05) == manager.generation


def test_wait_for_slots_returns_once_enough_slots_exist() -> None:
    discovery = StaticHostDiscovery("h1:1")
    with HostManager(discovery, poll_interval_s=0.02) as manager:
        timer = threading.Timer(0.2, discovery.set_hosts, args=("h1:1,h2:3",))
        timer.start()
        try:
            hosts = manager.wait_for_slots(4, timeout_s=10)
        finally:
            timer.cancel()
        assert {h: info.slots for h, info in hosts.items()} == {"h1": 1, "h2": 3}


def test_stop_ends_a_wait_for_slots_at_once() -> None:
    """Shutting a job down while it waits for slots must not wait out the (often long) timeout."""
    manager = HostManager(StaticHostDiscovery("h1:1"), poll_interval_s=0.02).start()
    timer = threading.Timer(0.2, manager.stop)
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(HostManagerStoppedError, match=r"stopped while waiting for at least 4 slots; saw 1"):
            manager.wait_for_slots(4, timeout_s=60)
    finally:
        timer.cancel()
    assert time.monotonic() - start < 10


def test_wait_for_slots_polls_itself_when_not_started() -> None:
    manager = HostManager(StaticHostDiscovery("h1:2"), poll_interval_s=0.02)
    assert set(manager.wait_for_slots(2, timeout_s=5)) == {"h1"}


def test_wait_for_slots_timeout_names_what_it_saw() -> None:
    discovery = FlakyDiscovery({"h1": 2})
    manager = HostManager(discovery, poll_interval_s=0.02)
    manager.refresh()
    discovery.error = RuntimeError("scheduler unreachable")
    start = time.monotonic()
    with pytest.raises(
        TimeoutError,
        match=r"Timed out after 0\.2 s waiting for at least 3 slots; saw 2 slots on 1 hosts \(h1: 2\); "
        r"last discovery error: scheduler unreachable\.",
    ):
        manager.wait_for_slots(3, timeout_s=0.2)
    assert time.monotonic() - start < 2


def test_failing_discovery_keeps_last_hosts(caplog: pytest.LogCaptureFixture) -> None:
    discovery = FlakyDiscovery({"h1": 2})
    manager = HostManager(discovery)
    manager.refresh()
    discovery.error = RuntimeError("boom")
    for _ in range(3):
        assert manager.refresh() == []
    assert manager.current_hosts["h1"].slots == 2
    assert isinstance(manager.last_error, RuntimeError)
    assert caplog.text.count("Host discovery failed") == 1  # logged once, not on every poll
    discovery.error = None
    manager.refresh()
    assert manager.last_error is None


def test_blacklisted_host_is_removed_and_returns_after_cooldown() -> None:
    discovery = StaticHostDiscovery("h1:2,h2:1")
    seen: list[HostEvent] = []
    with HostManager(discovery, poll_interval_s=0.02, cooldown_range=(0.3, 0.3)) as manager:
        manager.add_listener(seen.extend)
        cooldown = manager.blacklist("h1")
        assert cooldown == pytest.approx(0.3)
        assert seen[0].change is HostChange.REMOVED
        assert seen[0].blacklisted
        assert list(manager.current_hosts) == ["h2"]
        assert manager.is_blacklisted("h1")
        wait_until(lambda: "h1" in manager.current_hosts, timeout_s=5, what="h1 back after its cooldown")
        assert seen[-1].change is HostChange.ADDED
        assert not manager.is_blacklisted("h1")
        # The second blacklisting waits twice as long (capped at hi = 0.3 s here).
        assert manager.blacklist("h1") == pytest.approx(0.3)


def test_wait_fails_at_once_when_every_host_is_blacklisted_for_good() -> None:
    manager = HostManager(StaticHostDiscovery("h1:2,h2:2"))
    manager.refresh()
    manager.blacklist("h1")
    manager.blacklist("h2")
    assert manager.blacklisted_hosts() == {"h1": None, "h2": None}
    start = time.monotonic()
    with pytest.raises(AllHostsBlacklistedError, match=r"Every discovered host is blacklisted \(h1, h2\)"):
        manager.wait_for_slots(1, timeout_s=30)
    assert time.monotonic() - start < 1


def test_wait_fails_at_once_when_cooldowns_outlast_the_deadline() -> None:
    manager = HostManager(StaticHostDiscovery("h1:1"), cooldown_range=(60, 120))
    manager.refresh()
    manager.blacklist("h1")
    with pytest.raises(AllHostsBlacklistedError):
        manager.wait_for_slots(1, timeout_s=5)


def test_wait_outlasts_a_short_cooldown() -> None:
    manager = HostManager(StaticHostDiscovery("h1:1"), poll_interval_s=0.02, cooldown_range=(0.2, 0.2))
    manager.refresh()
    manager.blacklist("h1")
    assert set(manager.wait_for_slots(1, timeout_s=5)) == {"h1"}


def test_stop_is_idempotent() -> None:
    manager = HostManager(StaticHostDiscovery("h1:1"), poll_interval_s=0.02).start()
    assert manager.running
    manager.stop()
    manager.stop()
    assert not manager.running


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"poll_interval_s": 0}, "poll_interval_s must be a positive number"),
        ({"poll_interval_s": -1.0}, "poll_interval_s must be a positive number"),
        ({"cooldown_range": (3, 1)}, "lower bound above its upper bound"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HostManager(StaticHostDiscovery("h1:1"), **kwargs)  # type: ignore[arg-type]


def test_not_a_discovery() -> None:
    with pytest.raises(ValueError, match=r"needs a HostDiscovery \(e\.g\. RayHostDiscovery\(\)\), got dict"):
        HostManager({"h1": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize(("min_slots", "timeout_s"), [(0, 1), (1, 0), (1.5, 1)])
def test_bad_wait_arguments(min_slots: object, timeout_s: float) -> None:
    with pytest.raises(ValueError, match="must be a positive"):
        HostManager(StaticHostDiscovery("h1:1")).wait_for_slots(min_slots, timeout_s)  # type: ignore[arg-type]
