"""The freshness rule both read models apply (shared/core/freshness.py), tested here once.

Usage updates: applied in order; another epoch, another device set or a node without a view
(for a reader that covers every node) ask for a fetch of that node alone; a gap or unchanged
usage is applied but leaves the node unconfirmed; `deleted` drops the node only under its own
epoch. Snapshots: accounting's snapshot is the authority; a view ahead of it survives only when
it was set while the request travelled, and then, on an update's word only, it is fetched
again. Where the scheduler's and the refit's read models used to disagree, the cases are named
below with the behaviour the rule settles on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.core.freshness import (
    QUOTA_TTL,
    Held,
    Table,
    UpdateAction,
    Verdict,
    quota_fresh,
    snapshot_verdict,
    update_action,
)

A = UpdateAction


def act(
    held: Held | None,
    revision: int,
    *,
    epoch: str = "e1",
    deleted: bool = False,
    table: Table = Table.CHANGED,
    covered: bool = True,
) -> UpdateAction:
    return update_action(
        held, epoch=epoch, revision=revision, deleted=deleted, table=table, covered=covered
    )


AT_3 = Held("e1", 3)


def test_the_next_revision_with_a_change_is_applied() -> None:
    assert act(AT_3, 4) is A.APPLY


def test_an_update_not_newer_than_the_view_is_ignored() -> None:
    for revision in (1, 2, 3):
        assert act(AT_3, revision) is A.IGNORE
        assert act(AT_3, revision, table=Table.OTHER_DEVICES) is A.IGNORE


def test_the_update_of_the_readers_own_commit_confirms_it() -> None:
    own = Held("e1", 3, local=True)
    assert act(own, 3) is A.CONFIRM
    assert act(own, 3, table=Table.OTHER_DEVICES) is A.CONFIRM
    assert act(own, 2) is A.IGNORE  # older than the commit: already superseded
    assert act(own, 4) is A.APPLY


def test_a_gap_or_unchanged_usage_is_applied_unconfirmed() -> None:
    # Two commits close together publish one update of revision 5 after 3: the table is the
    # node's latest, a change it does not show may hide in the gap. A bump without a usage
    # change is a cordon, a register change, a bind phase: not in the table either.
    # (Where the two read models disagreed: the scheduler applied and decided on it, the refit
    # applied and fetched before deciding. The rule says: apply, no refusal rests on it; the
    # refit, which decides and refuses in one step, meets that by fetching first.)
    assert act(AT_3, 5) is A.APPLY_UNCONFIRMED
    assert act(AT_3, 4, table=Table.UNCHANGED) is A.APPLY_UNCONFIRMED
    assert act(AT_3, 9, table=Table.UNCHANGED) is A.APPLY_UNCONFIRMED


def test_another_device_set_is_fetched() -> None:
    assert act(AT_3, 4, table=Table.OTHER_DEVICES) is A.FETCH
    assert act(AT_3, 7, table=Table.OTHER_DEVICES) is A.FETCH


def test_another_epoch_marks_that_node_stale_whatever_its_revision() -> None:
    # Revisions of two ownerships do not compare: neither a higher nor a lower one is applied.
    # (Where the two read models disagreed: on an epoch it had never seen, the scheduler
    # fetched every node of the cluster. A takeover publishes each node of its partition
    # under the new epoch before it serves, and fencing refuses a decision of another epoch:
    # the node alone is fetched.)
    for revision in (1, 3, 4, 99):
        for table in Table:
            assert act(AT_3, revision, epoch="e2", table=table) is A.FETCH


def test_deleted_drops_the_node_under_its_own_epoch_only() -> None:
    assert act(AT_3, 4, deleted=True, table=Table.OTHER_DEVICES) is A.DROP
    assert act(AT_3, 1, deleted=True) is A.DROP  # gone is gone, whatever the revision
    # (Where the two read models disagreed: the refit dropped the node on a `deleted` of any
    # epoch. Another ownership's word about the node is not accounting's current one: the
    # fetch decides. Dropping would make the scheduler treat the node as unknown, a refusal.)
    assert act(AT_3, 4, epoch="e2", deleted=True) is A.FETCH


def test_a_node_without_a_view() -> None:
    # A reader whose full snapshot covered every node: a new node, fetched; a deleted one,
    # forgotten (it may have been announced and marked stale).
    assert act(None, 1) is A.FETCH
    assert act(None, 1, epoch="e9", table=Table.OTHER_DEVICES) is A.FETCH
    assert act(None, 1, deleted=True) is A.DROP
    # Before the first full snapshot, or for a reader that keeps only the nodes it was asked
    # about (the refit): nothing to apply it to, and the node's first snapshot includes it.
    # (The two used to agree here by different paths; the rule names it.)
    for deleted in (False, True):
        assert act(None, 1, deleted=deleted, covered=False) is A.IGNORE


@given(
    revision=st.integers(0, 12),
    held=st.integers(0, 12),
    same_epoch=st.booleans(),
    local=st.booleans(),
    deleted=st.booleans(),
    table=st.sampled_from(Table),
)
def test_only_the_next_revision_of_the_same_epoch_with_a_change_applies_as_is(
    revision: int, held: int, same_epoch: bool, local: bool, deleted: bool, table: Table
) -> None:
    action = act(
        Held("e1", held, local),
        revision,
        epoch="e1" if same_epoch else "e2",
        deleted=deleted,
        table=table,
    )
    applies = action in (A.APPLY, A.APPLY_UNCONFIRMED)
    assert applies == (
        same_epoch and not deleted and revision > held and table is not Table.OTHER_DEVICES
    )
    assert (action is A.APPLY) == (applies and revision == held + 1 and table is Table.CHANGED)
    assert (action is A.DROP) == (same_epoch and deleted)
    assert (action is A.CONFIRM) == (same_epoch and not deleted and local and revision == held)


def test_quota_is_trusted_for_its_ttl() -> None:
    assert quota_fresh(100.0, 100.0)
    assert quota_fresh(100.0, 100.0 + QUOTA_TTL)
    assert not quota_fresh(100.0, 100.1 + QUOTA_TTL)


def verdict(
    held: int, answer: int, *, tick: int, sent: int, confirmed: bool = False, epoch: str = "e1"
) -> Verdict:
    return snapshot_verdict(
        held_epoch="e1",
        held_revision=held,
        held_tick=tick,
        held_confirmed=confirmed,
        epoch=epoch,
        revision=answer,
        sent=sent,
    )


def test_an_answer_as_new_or_newer_is_taken() -> None:
    assert verdict(3, 3, tick=5, sent=1) is Verdict.TAKE
    assert verdict(3, 4, tick=5, sent=1) is Verdict.TAKE


def test_a_view_ahead_of_an_answer_asked_after_it_is_impossible() -> None:
    # An update at revision+1 seen before the request went out, and accounting still answers
    # the old revision: the update was forged or buggy.
    assert verdict(4, 3, tick=5, sent=5) is Verdict.TAKE
    assert verdict(4, 3, tick=2, sent=5, confirmed=True) is Verdict.TAKE


def test_a_view_set_while_the_request_travelled_is_kept() -> None:
    assert verdict(4, 3, tick=6, sent=5) is Verdict.RECHECK  # an update's word: fetch again
    assert verdict(4, 3, tick=6, sent=5, confirmed=True) is Verdict.KEEP  # accounting's own


def test_revisions_of_another_epoch_do_not_compare() -> None:
    assert verdict(9, 1, tick=6, sent=5, epoch="e2") is Verdict.TAKE


@given(
    held=st.integers(0, 20),
    answer=st.integers(0, 20),
    tick=st.integers(0, 20),
    sent=st.integers(0, 20),
    confirmed=st.booleans(),
)
def test_only_a_view_newer_than_the_request_outlives_an_older_answer(
    held: int, answer: int, tick: int, sent: int, confirmed: bool
) -> None:
    result = verdict(held, answer, tick=tick, sent=sent, confirmed=confirmed)
    kept = result is not Verdict.TAKE
    assert kept == (held > answer and tick > sent)
    assert (result is Verdict.RECHECK) == (kept and not confirmed)
