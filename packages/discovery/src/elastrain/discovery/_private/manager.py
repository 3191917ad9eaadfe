"""Keeps the current set of usable hosts up to date by polling a discovery in a background thread."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable
from types import TracebackType

from elastrain.discovery._private.blacklist import Blacklist
from elastrain.discovery._private.events import HostEvent, diff_hosts
from elastrain.discovery._private.hosts import HostDiscovery, HostDiscoveryClosedError, HostInfo
from elastrain.discovery._private.validation import check_positive

logger = logging.getLogger("elastrain.discovery")

HostListener = Callable[[list[HostEvent]], None]


class AllHostsBlacklistedError(RuntimeError):
    """Every host the discovery reports is blacklisted, and none returns before the wait's deadline."""


class HostManagerStoppedError(RuntimeError):
    """The host manager was stopped while a wait on it was in progress (e.g. the job was shut down)."""


class HostManager:
    """The hosts a job can use now: what the discovery reports, minus blacklisted hosts.

    ``start()`` polls the discovery every ``poll_interval_s`` seconds in a daemon thread; :meth:`refresh` polls
    once on the calling thread. Each change is reported to listeners as a list of :class:`HostEvent` and bumps
    :attr:`generation`. Hosts keep the order in which they were first seen, so slot assignment stays stable
    while hosts come and go. A discovery that fails keeps the last known hosts; the error is logged once and
    kept in :attr:`last_error`.

    The poll thread ends on its own, without a warning, when the discovery raises
    :class:`~elastrain.discovery.HostDiscoveryClosedError` (``RayHostDiscovery`` once Ray is shut down) and when
    the interpreter exits, so a job that never calls ``stop()`` leaves nothing behind.
    """

    def __init__(
        self,
        discovery: HostDiscovery,
        *,
        poll_interval_s: float = 1.0,
        cooldown_range: tuple[float, float] | None = None,
        blacklist: Blacklist | None = None,
    ) -> None:
        if not isinstance(discovery, HostDiscovery):
            raise ValueError(
                f"HostManager needs a HostDiscovery (e.g. RayHostDiscovery()), got {type(discovery).__name__}."
            )
        check_positive("poll_interval_s", poll_interval_s)
        if blacklist is not None and cooldown_range is not None:
            raise ValueError("Pass either cooldown_range or a Blacklist, not both.")
        self.discovery = discovery
        self.poll_interval_s = float(poll_interval_s)
        self._blacklist = blacklist if blacklist is not None else Blacklist(cooldown_range)
        self._changed = threading.Condition(threading.RLock())
        self._refresh_lock = threading.Lock()  # one poll at a time, so listeners see events in order
        self._discovered: dict[str, HostInfo] = {}
        self._usable: dict[str, HostInfo] = {}
        self._generation = 0
        self._last_error: Exception | None = None
        self._listeners: list[HostListener] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> HostManager:
        """Poll once now, then keep polling in the background until :meth:`stop`."""
        if self.running:
            return self
        self.refresh()
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll_forever, name="elastrain-host-manager", daemon=True)
        _stop_at_exit(self)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._halt()
        thread.join(timeout_s)
        if thread.is_alive():
            logger.warning("The host manager's poll thread did not stop within %s s (discovery hung?).", timeout_s)

    def __enter__(self) -> HostManager:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """Whether the poll thread runs: after :meth:`start`, until :meth:`stop` or the discovery closed."""
        return self._thread is not None and not self._stop.is_set()

    # -- state -----------------------------------------------------------------------------------------------

    @property
    def current_hosts(self) -> dict[str, HostInfo]:
        """Usable hosts in first-seen order."""
        with self._changed:
            return dict(self._usable)

    @property
    def available_slots(self) -> int:
        with self._changed:
            return sum(host.slots for host in self._usable.values())

    @property
    def generation(self) -> int:
        """Bumped on every change of :attr:`current_hosts`."""
        with self._changed:
            return self._generation

    @property
    def last_error(self) -> Exception | None:
        """The error of the latest poll, or ``None`` when it succeeded."""
        with self._changed:
            return self._last_error

    def add_listener(self, listener: HostListener) -> Callable[[], None]:
        """Call ``listener(events)`` after every change; returns a function that removes it.

        Listeners run on the thread that polled; one that raises is logged and kept.
        """
        with self._changed:
            self._listeners.append(listener)

        def remove() -> None:
            with self._changed:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    # -- polling ---------------------------------------------------------------------------------------------

    def refresh(self) -> list[HostEvent]:
        """Poll the discovery once and apply what changed; returns the events (empty when nothing did)."""
        with self._refresh_lock:
            try:
                discovered = self.discovery.find_available_hosts()
            except Exception as error:
                self._record_error(error)
                return []
            with self._changed:
                self._last_error = None
                order = {host_id: i for i, host_id in enumerate(self._discovered)}
                self._discovered = dict(sorted(discovered.items(), key=lambda item: order.get(item[0], len(order))))
                events = self._apply()
            self._notify(events)
            return events

    def blacklist(self, host_id: str) -> float | None:
        """Take ``host_id`` out of service; returns its cooldown in seconds, ``None`` when it is out for good.

        Does not wait for a poll in progress, so a slow discovery never delays the caller.
        """
        cooldown = self._blacklist.add(host_id)
        with self._changed:
            events = self._apply()
        self._notify(events)
        logger.info("Blacklisted host %s %s.", host_id, "for good" if cooldown is None else f"for {cooldown:.1f} s")
        return cooldown

    def is_blacklisted(self, host_id: str) -> bool:
        return self._blacklist.is_blacklisted(host_id)

    def blacklisted_hosts(self) -> dict[str, float | None]:
        """``{host_id: seconds until it may return, or None for never}``."""
        return self._blacklist.active()

    def _apply(self) -> list[HostEvent]:
        """Recompute usable hosts from the latest discovery and the blacklist. Caller holds ``_changed``."""
        usable = {h: info for h, info in self._discovered.items() if not self._blacklist.is_blacklisted(h)}
        events = diff_hosts(self._usable, usable)
        events = [
            dataclasses.replace(event, blacklisted=True)
            if event.host_id in self._discovered and event.host_id not in usable
            else event
            for event in events
        ]
        if events:
            self._usable = usable
            self._generation += 1
            self._changed.notify_all()
        return events

    def _notify(self, events: list[HostEvent]) -> None:
        if not events:
            return
        with self._changed:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(events)
            except Exception:
                logger.exception("A host change listener raised; it stays registered.")

    def _record_error(self, error: Exception) -> None:
        with self._changed:
            repeated = self._last_error is not None and str(self._last_error) == str(error)
            self._last_error = error
            self._changed.notify_all()
        if isinstance(error, HostDiscoveryClosedError) or self._stop.is_set():
            logger.debug("Host discovery ended: %s", error)  # the job is over or ending: nothing to warn about
        elif not repeated:
            logger.warning("Host discovery failed; keeping the last known hosts: %s", error)

    def _poll_forever(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            self.refresh()
            if isinstance(self.last_error, HostDiscoveryClosedError):
                self._halt()
                return

    def _halt(self) -> None:
        """End polling and wake every waiter (who then sees that the manager stopped)."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()

    # -- waiting ---------------------------------------------------------------------------------------------

    def wait_for_slots(self, min_slots: int, timeout_s: float) -> dict[str, HostInfo]:
        """Block until the usable hosts have at least ``min_slots`` slots; return those hosts.

        Raises :class:`TimeoutError` naming what was seen once ``timeout_s`` passes,
        :class:`AllHostsBlacklistedError` at once when every discovered host is blacklisted and none comes
        back before the deadline, and :class:`HostManagerStoppedError` as soon as :meth:`stop` is called
        during a wait that began while the manager was running. Without a running poll thread the wait polls
        on the calling thread.
        """
        check_positive("min_slots", min_slots, integer=True)
        check_positive("timeout_s", timeout_s)
        deadline = time.monotonic() + timeout_s
        polled_in_background = self.running
        while True:
            if not polled_in_background:
                self.refresh()
            with self._changed:
                if polled_in_background and not self.running:
                    # Whoever stopped the manager is ending the job: waiting on would only hold them up.
                    raise HostManagerStoppedError(
                        f"The host manager was stopped while {self._describe_shortfall(min_slots)}"
                    )
                slots = sum(host.slots for host in self._usable.values())
                if slots >= min_slots:
                    return dict(self._usable)
                remaining = deadline - time.monotonic()
                self._fail_if_all_blacklisted(min_slots, remaining)
                if remaining <= 0:
                    raise TimeoutError(f"Timed out after {timeout_s} s {self._describe_shortfall(min_slots)}")
                self._changed.wait(min(remaining, self.poll_interval_s))

    def wait_for_change(self, generation: int, timeout_s: float) -> int:
        """Block until :attr:`generation` differs from ``generation`` or ``timeout_s`` passes; return it."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._generation == generation and not self._stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            return self._generation

    def _fail_if_all_blacklisted(self, min_slots: int, remaining_s: float) -> None:
        if not self._discovered:
            return
        blacklisted = self._blacklist.active()
        if not all(host_id in blacklisted for host_id in self._discovered):
            return
        returns_in = [s for h in self._discovered if (s := blacklisted[h]) is not None]
        if returns_in and min(returns_in) < remaining_s:
            return
        raise AllHostsBlacklistedError(
            f"Every discovered host is blacklisted ({', '.join(self._discovered)}) and none returns in time, "
            f"so {min_slots} slots cannot be reached; check why workers on these hosts failed, or pass a "
            "cooldown_range so blacklisted hosts return."
        )

    def _describe_shortfall(self, min_slots: int) -> str:
        slots = sum(host.slots for host in self._usable.values())
        seen = ", ".join(f"{h}: {info.slots}" for h, info in self._usable.items()) or "no hosts"
        text = f"waiting for at least {min_slots} slots; saw {slots} slots on {len(self._usable)} hosts ({seen})"
        blacklisted = self._blacklist.active()
        if blacklisted:
            text += f"; blacklisted: {', '.join(blacklisted)}"
        if self._last_error is not None:
            text += f"; last discovery error: {self._last_error}"
        return text + "."


# Managers whose poll thread may still run. At interpreter exit they are told to stop, before Ray's own exit
# hook (registered earlier, so it runs later) shuts Ray down under a running poll.
_running: weakref.WeakSet[HostManager] = weakref.WeakSet()
_exit_hook_lock = threading.Lock()


def _stop_at_exit(manager: HostManager) -> None:
    with _exit_hook_lock:
        if not _running:
            atexit.unregister(_stop_all)
            atexit.register(_stop_all)  # (again) after whatever registered since, e.g. Ray, so it runs first
        _running.add(manager)


def _stop_all() -> None:
    """Does not wait for the threads: they are daemons, and a poll in progress must not delay the exit."""
    for manager in list(_running):
        manager._halt()
