"""assign_slots: a pure function, checked by example and by property."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastrain.discovery import HostInfo, SlotInfo, assign_slots


def test_fills_hosts_in_order() -> None:
    assert assign_slots({"h1": 2, "h2": 1, "h3": 2}, 4) == [
        SlotInfo("h1", rank=0, size=4, local_rank=0, local_size=2, cross_rank=0, cross_size=3),
        SlotInfo("h1", rank=1, size=4, local_rank=1, local_size=2, cross_rank=0, cross_size=1),
        SlotInfo("h2", rank=2, size=4, local_rank=0, local_size=1, cross_rank=1, cross_size=3),
        SlotInfo("h3", rank=3, size=4, local_rank=0, local_size=1, cross_rank=2, cross_size=3),
    ]


def test_two_hosts_two_workers_each() -> None:
    placements = assign_slots({"a": 2, "b": 2}, 4)
    assert [(p.host_id, p.rank, p.local_rank, p.cross_rank, p.cross_size) for p in placements] == [
        ("a", 0, 0, 0, 2),
        ("a", 1, 1, 0, 2),
        ("b", 2, 0, 1, 2),
        ("b", 3, 1, 1, 2),
    ]


def test_accepts_host_infos_and_skips_empty_hosts() -> None:
    hosts = {"a": HostInfo("a", 0), "b": HostInfo("b", 3)}
    assert {p.host_id for p in assign_slots(hosts, 3)} == {"b"}


def test_too_many_workers() -> None:
    with pytest.raises(ValueError, match=r"Cannot place 4 workers on 3 slots \(2 hosts\)"):
        assign_slots({"a": 1, "b": 2}, 4)


@pytest.mark.parametrize("num_workers", [0, -1, 1.0, True])
def test_bad_worker_count(num_workers: object) -> None:
    with pytest.raises(ValueError, match="num_workers must be a positive integer"):
        assign_slots({"a": 1}, num_workers)  # type: ignore[arg-type]


hosts_strategy = st.dictionaries(
    st.text(alphabet="abcdefgh", min_size=1, max_size=4), st.integers(0, 6), min_size=1, max_size=8
).filter(lambda hosts: sum(hosts.values()) > 0)


@given(data=st.data(), hosts=hosts_strategy)
def test_placement_properties(data: st.DataObject, hosts: dict[str, int]) -> None:
    num_workers = data.draw(st.integers(1, sum(hosts.values())))
    placements = assign_slots(hosts, num_workers)

    assert [p.rank for p in placements] == list(range(num_workers))
    assert all(p.size == num_workers for p in placements)
    by_host: dict[str, list[SlotInfo]] = {}
    for p in placements:
        by_host.setdefault(p.host_id, []).append(p)
    for host_id, host_placements in by_host.items():
        assert len(host_placements) <= hosts[host_id]
        assert [p.local_rank for p in host_placements] == list(range(len(host_placements)))
        assert all(p.local_size == len(host_placements) for p in host_placements)
    # Hosts are filled in order: every host before the last one used is full.
    used = list(by_host)
    assert used == [h for h in hosts if h in by_host]
    assert all(len(by_host[h]) == hosts[h] for h in used[:-1])
    # Cross ranks: per local rank, hosts numbered 0..cross_size-1 in host order.
    for local_rank in {p.local_rank for p in placements}:
        group = [p for p in placements if p.local_rank == local_rank]
        assert [p.cross_rank for p in group] == list(range(len(group)))
        assert all(p.cross_size == len(group) for p in group)
    # Pure: the same input gives the same placement.
    assert assign_slots(hosts, num_workers) == placements
