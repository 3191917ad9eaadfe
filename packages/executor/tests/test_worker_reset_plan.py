"""The reset plan: every member derives its part from the same counts, so all take the same way."""

from __future__ import annotations

from elastrain.executor._private.elastic.worker.reset import Counts, ResetPlan, StateLoss, SyncRole, plan_reset


def counts(
    commits: tuple[int, ...],
    at_commit: tuple[bool, ...] | None = None,
    skip: bool = False,
    persist: bool = False,
    high_water: int = 0,
) -> Counts:
    return Counts(commits, at_commit or (False,) * len(commits), skip, persist, high_water)


def plans(found: Counts, generation: int = 2, start_over: bool = False) -> list[ResetPlan]:
    return [
        plan_reset(found, rank, generation, found.commits[rank], found.at_commit[rank], start_over)
        for rank in range(len(found.commits))
    ]


def test_the_lowest_rank_with_the_most_commits_is_the_source() -> None:
    newcomer, source, other = plans(counts((0, 5, 5), at_commit=(False, True, True)))
    assert {p.source for p in (newcomer, source, other)} == {1}
    assert source.role is SyncRole.SOURCE
    assert source.keeps_committed
    assert other.role is SyncRole.RECEIVER_KEEPS_COMMITTED
    assert newcomer.role is SyncRole.RECEIVER_FRESH_COMMITTED
    assert all(p.best == 5 and p.run_callbacks and p.loss is StateLoss.NONE for p in (newcomer, source, other))


def test_a_member_with_work_since_its_commit_gets_a_fresh_committed_copy() -> None:
    _, between = plans(counts((5, 5), at_commit=(True, False)))
    assert between.role is SyncRole.RECEIVER_FRESH_COMMITTED
    assert not between.keeps_committed
    # ...and so does everyone when the source has work since its commit: what it sends is newer.
    _, at_commit = plans(counts((5, 5), at_commit=(False, True)))
    assert not at_commit.keeps_committed


def test_the_full_sync_is_skipped_only_when_everyone_asks_and_holds_the_count() -> None:
    assert all(p.skip_sync for p in plans(counts((3, 3), skip=True)))
    assert not any(p.skip_sync for p in plans(counts((3, 2), skip=True)))
    assert not any(p.skip_sync for p in plans(counts((3, 3), skip=False)))


def test_no_commits_anywhere_loads_persisted_state_when_everyone_persists() -> None:
    fresh = plans(counts((0, 0), persist=True), generation=1)
    assert all(p.role is SyncRole.LOAD_PERSISTED and p.loss is StateLoss.NONE for p in fresh)
    nothing_persisted = fresh[1].without_persisted(start_over_on_state_loss=False)
    assert nothing_persisted.role is SyncRole.RECEIVER_FRESH_COMMITTED
    assert nothing_persisted.loss is StateLoss.NONE  # a fresh job: nothing was lost
    assert not nothing_persisted.run_callbacks  # the first world's sync is no reset


def test_a_lost_state_fails_or_starts_over_on_every_member_alike() -> None:
    lost = counts((0, 0), high_water=7)
    assert {p.loss for p in plans(lost)} == {StateLoss.FAIL}
    assert {p.loss for p in plans(lost, start_over=True)} == {StateLoss.START_OVER}
    persisted = plans(counts((0, 0), persist=True, high_water=7))
    assert {p.loss for p in persisted} == {StateLoss.RESUME_PERSISTED}
    assert {p.without_persisted(False).loss for p in persisted} == {StateLoss.FAIL}
    assert {p.without_persisted(True).loss for p in persisted} == {StateLoss.START_OVER}
    # A member that holds commits is the source: nothing is lost, whatever the mark says.
    assert {p.loss for p in plans(counts((0, 2), high_water=7))} == {StateLoss.NONE}


def test_persistence_on_some_members_only_is_no_persistence() -> None:
    found = Counts((0, 0), (False, False), False, False, 0)
    assert all(p.role is not SyncRole.LOAD_PERSISTED for p in plans(found))
