"""The sharded reset's plan, as properties over random layouts, world changes and losses (hypothesis).

A state of a few tensors is cut FSDP2's way (dim 0 in ``ceil(n / size)`` rows per rank) over an old world, each
rank's copy kept by itself and, with redundancy, by its buddy; some old ranks die; the survivors and newcomers
form a new world of another size. Whatever happened, the plan must load the newest version that is still whole,
and fill every chunk of the new layout exactly once.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastrain.executor._private.elastic.worker.shard_plan import (
    Holding,
    TensorInfo,
    arrange_mesh,
    overlap,
    plan_shards,
    ring_shift,
    volume,
)

TENSORS = {"model/w": TensorInfo((7, 3), "float32"), "model/b": TensorInfo((5,), "float32")}


def fsdp_chunks(size: int) -> list[dict[str, tuple[tuple[int, ...], tuple[int, ...]]]]:
    """Each rank's chunk of every tensor, as FSDP2 shards dim 0."""
    layouts = []
    for rank in range(size):
        chunks = {}
        for key, info in TENSORS.items():
            rows = info.global_shape[0]
            per = math.ceil(rows / size)
            start = min(rank * per, rows)
            count = max(min(per, rows - start), 0)
            chunks[key] = ((start, *([0] * (len(info.global_shape) - 1))), (count, *info.global_shape[1:]))
        layouts.append(chunks)
    return layouts


Layout = dict[str, tuple[tuple[int, ...], tuple[int, ...]]]


def holding(version: int, *layouts: Layout, replicated: bool = True) -> Holding:
    chunks: dict[str, tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]] = {}
    for layout in layouts:
        for key, box in layout.items():
            if box not in chunks.get(key, ()):
                chunks[key] = (*chunks.get(key, ()), box)
    return Holding(version, version, chunks, dict(TENSORS), replicated)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[int, list[int], int, bool]:
    old = draw(st.integers(1, 6))
    dead = draw(st.lists(st.integers(0, old - 1), unique=True, max_size=old))
    newcomers = draw(st.integers(0 if len(dead) < old else 1, 3))
    redundancy = draw(st.booleans())
    return old, sorted(dead), newcomers, redundancy


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_the_plan_fills_every_new_chunk_exactly_once_from_a_live_holder(
    world: tuple[int, list[int], int, bool],
) -> None:
    old, dead, newcomers, redundancy = world
    old_layouts = fsdp_chunks(old)
    shift = ring_shift([str(r) for r in range(old)])
    survivors = [r for r in range(old) if r not in dead]
    held = []
    for r in survivors:
        ward = (r - shift) % old
        layouts = [old_layouts[r], old_layouts[ward]] if redundancy and old > 1 else [old_layouts[r]]
        held.append([holding(1, old_layouts[r]), holding(2, *layouts)])
    held += [[] for _ in range(newcomers)]
    new_size = len(held)
    targets = fsdp_chunks(new_size)
    plan = plan_shards(held, targets)

    def whole(version_layouts: list[list[Layout]]) -> bool:
        return all(
            any(layout == old_layouts[r] for layouts in version_layouts for layout in layouts)
            for r in range(old)
            if any(volume(box) for box in old_layouts[r].values())  # a rank with empty chunks held nothing
        )

    with_buddies = [
        [old_layouts[r], old_layouts[(r - shift) % old]] if redundancy and old > 1 else [old_layouts[r]]
        for r in survivors
    ]
    alone = [[old_layouts[r]] for r in survivors]
    expected = 2 if whole(with_buddies) else (1 if whole(alone) else None)
    assert plan.version == expected
    if expected is None:
        assert plan.pieces == ()
        return
    for target_rank, wanted in enumerate(targets):
        for key, box in wanted.items():
            pieces = [p for p in plan.pieces if p.target == target_rank and p.key == key]
            assert sum(p.numel for p in pieces) == volume(box)
            for i, a in enumerate(pieces):
                assert overlap(a.box, box) == a.box
                assert overlap(a.box, a.from_chunk) == a.box
                assert all(overlap(a.box, b.box) is None for b in pieces[i + 1 :])
                holder = held[a.source]
                assert any(a.from_chunk in h.chunks.get(key, ()) for h in holder if h.version == expected)


def test_a_piece_a_rank_holds_itself_is_copied_locally() -> None:
    layouts = fsdp_chunks(2)
    held = [[holding(3, layouts[0], layouts[1])], [holding(3, layouts[1], layouts[0])]]
    plan = plan_shards(held, layouts)
    assert plan.version == 3
    assert all(p.source == p.target for p in plan.pieces)


def test_the_buddy_is_on_another_node_where_the_world_allows() -> None:
    assert ring_shift(["a", "a", "b", "b"]) == 2
    assert ring_shift(["a", "b", "c"]) == 1
    assert ring_shift(["a", "a", "a"]) == 1  # one node: any other rank


def test_overlapping_chunks_of_one_version_are_refused() -> None:
    info = {"model/w": TensorInfo((4,), "float32")}
    bad = Holding(1, 1, {"model/w": (((0,), (3,)), ((2,), (2,)))}, info, True)
    with pytest.raises(ValueError, match="overlap"):
        plan_shards([[bad]], [{"model/w": ((0,), (4,))}])


def test_an_hsdp_mesh_keeps_a_replica_group_that_went_on_in_one_row_whatever_its_new_ranks() -> None:
    # The replica group that went on (row 0 of its last mesh, version 9) came back as ranks 1 and 2 of a world of
    # four; rank 0 held an older version, rank 3 is new. Rows ascend: FSDP2 shards a row in rank order.
    hints = [(7, (2, 1, 0)), (9, (2, 0, 0)), (9, (2, 0, 1)), None]
    assert arrange_mesh((2, 2), hints) == [[0, 3], [1, 2]]
    # Ranks already in place keep the plain layout.
    assert arrange_mesh((2, 2), [(9, (2, 0, 0)), (9, (2, 0, 1)), (9, (2, 1, 0)), (9, (2, 1, 1))]) == [[0, 1], [2, 3]]
    # A group whose new ranks reversed its columns cannot stay in place in an ascending row: rank order it is.
    assert arrange_mesh((1, 2), [(9, (2, 0, 1)), (9, (2, 0, 0))]) == [[0, 1]]
    # Another shard size: copies of another layout give no place.
    assert arrange_mesh((1, 4), [(9, (2, 0, 1)), (9, (2, 0, 0)), None, None]) == [[0, 1, 2, 3]]


@settings(max_examples=200, deadline=None)
@given(shape=st.sampled_from([(1, 2), (2, 2), (3, 2), (2, 3), (1, 4), (4, 1)]), data=st.data())
def test_an_hsdp_arrangement_places_every_rank_once_in_ascending_rows(
    shape: tuple[int, int], data: st.DataObject
) -> None:
    replicas, shard_size = shape
    size = replicas * shard_size
    hint = st.one_of(
        st.none(),
        st.tuples(st.integers(0, 2), st.tuples(st.sampled_from([1, 2, 3]), st.integers(0, 3), st.integers(0, 2))),
    )
    hints = [
        h if h is None or h[1][2] < h[1][0] else None for h in data.draw(st.lists(hint, min_size=size, max_size=size))
    ]
    mesh = arrange_mesh(shape, hints)
    assert len(mesh) == replicas
    assert all(len(row) == shard_size for row in mesh)
    assert sorted(r for row in mesh for r in row) == list(range(size))
    assert all(row == sorted(row) for row in mesh)
    newest = max((h[0] for h in hints if h is not None), default=None)
    whole = []  # rows of the last mesh that came back whole, up to date, with their columns in rank order
    for old_row in sorted({h[1][1] for h in hints if h is not None}):
        members = [(r, h[1][2]) for r, h in enumerate(hints) if h is not None and h[0] == newest]
        members = [(r, c) for r, c in members if hints[r][1][:2] == (shard_size, old_row)]  # type: ignore[index]
        if [c for _, c in members] == list(range(shard_size)):
            whole.append([r for r, _ in members])
    kept = [row for row in whole if row in mesh]
    assert len(kept) == min(len(whole), replicas), (whole, mesh)
