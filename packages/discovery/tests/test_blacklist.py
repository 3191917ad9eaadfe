"""Blacklist cooldowns: exponential backoff with bounded jitter, capped, then the host returns."""

from __future__ import annotations

import random

import pytest

from elastrain.discovery import Blacklist


class FakeClock:
    """A clock the test advances, so cooldown arithmetic is checked exactly (real-time returns are tested
    through HostManager in test_manager.py)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_without_cooldown_a_host_never_returns() -> None:
    clock = FakeClock()
    blacklist = Blacklist(None, clock=clock)
    assert blacklist.add("h1") is None
    clock.now += 1e9
    assert blacklist.is_blacklisted("h1")
    assert blacklist.active() == {"h1": None}


def test_cooldown_doubles_with_jitter_and_is_capped() -> None:
    clock = FakeClock()
    blacklist = Blacklist((1.0, 10.0), clock=clock, rng=random.Random(7))
    for n, base in enumerate([1.0, 2.0, 4.0, 8.0, 16.0, 32.0]):
        cooldown = blacklist.add("h1")
        assert cooldown is not None
        assert min(base, 10.0) <= cooldown <= min(base * 1.25, 10.0), (n, cooldown)
        assert blacklist.times_blacklisted("h1") == n + 1
        clock.now += cooldown - 0.001
        assert blacklist.is_blacklisted("h1")
        clock.now += 0.002
        assert not blacklist.is_blacklisted("h1")
        assert blacklist.active() == {}


def test_blacklisting_again_during_cooldown_does_not_escalate() -> None:
    clock = FakeClock()
    blacklist = Blacklist((4.0, 100.0), clock=clock, rng=random.Random(1))
    first = blacklist.add("h1")
    assert first is not None
    clock.now += 1.0
    again = blacklist.add("h1")
    assert again == pytest.approx(first - 1.0)
    assert blacklist.times_blacklisted("h1") == 1


def test_hosts_are_independent() -> None:
    blacklist = Blacklist((1.0, 2.0), clock=FakeClock())
    blacklist.add("h1")
    assert not blacklist.is_blacklisted("h2")
    assert set(blacklist.active()) == {"h1"}


@pytest.mark.parametrize(
    ("cooldown_range", "message"),
    [
        ((5, 1), r"cooldown_range=\(5, 1\) has its lower bound above its upper bound"),
        ((0, 1), "cooldown_range lower bound must be a positive number"),
        ((1, -1), "cooldown_range upper bound must be a positive number"),
        ((1, 2, 3), r"cooldown_range must be a pair \(lo, hi\)"),
        (5, r"cooldown_range must be a pair \(lo, hi\)"),
    ],
)
def test_bad_cooldown_range(cooldown_range: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Blacklist(cooldown_range)  # type: ignore[arg-type]
