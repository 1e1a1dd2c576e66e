"""The read model's freshness rules, without NATS: apply updates in order, or ask for a fetch
when an update cannot describe the node completely (new epoch, unknown node, other devices);
one that may hide a change (a gap, unchanged usage such as a cordon) is applied and leaves the
node unconfirmed until a snapshot (a refusal fetches it first); accounting's snapshot overrules
a view ahead of it unless that view arrived while the snapshot travelled (then the node is
fetched again); quota is trusted a while."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.freshness import QUOTA_TTL
from shared.core.model import DeviceInfo, DeviceUsage, NodeSnapshot
from shared.core.quota import QuotaLedger, QuotaLimit
from shared.messages import UsageEntry, UsageUpdate
from svc_scheduler.freshness import Freshness, NodeView

GPU = DeviceInfo("GPU-a", 0, 10, 40000, 100, "NVIDIA A100", 0)
NAMES = ["node-1", "node-2", "node-3", "node-4"]


def view(revision: int, node: str = "node-1", used: int = 0) -> NodeView:
    return NodeView(node, revision, NodeSnapshot(node, [DeviceUsage(GPU, used, 0, 0)]))


def usage(used: int, mem: int = 0, cores: int = 0) -> dict[str, UsageEntry]:
    return {"GPU-a": UsageEntry(used=used, usedmem=mem, usedcores=cores)}


def update(
    revision: int,
    devices: dict[str, UsageEntry] | None = None,
    *,
    node: str = "node-1",
    epoch: str = "e1",
    deleted: bool = False,
) -> UsageUpdate:
    table = usage(1) if devices is None else devices
    return UsageUpdate(epoch=epoch, node=node, revision=revision, devices=table, deleted=deleted)


def fresh_at(revision: int = 3) -> Freshness:
    state = Freshness()
    state.apply_snapshot("e1", [view(revision)], full=True)
    assert state.is_fresh("node-1") and not state.needs_full
    return state


def test_before_the_first_snapshot_everything_is_fetched_and_updates_ignored() -> None:
    state = Freshness()
    assert state.needs_full and state.epoch is None
    state.apply_update(update(1))
    assert state.view("node-1") is None
    assert len(state) == 0


def test_in_order_update_applies_without_a_fetch() -> None:
    state = fresh_at(3)
    before = state.view("node-1")
    state.apply_update(update(4, usage(1, 20000, 30)))
    after = state.view("node-1")
    assert after is not None and after.revision == 4 and after.snapshot is not None
    assert after.snapshot.usage_table() == {"GPU-a": {"used": 1, "usedmem": 20000, "usedcores": 30}}
    assert state.is_fresh("node-1") and not state.needs_fetch("node-1")
    # Views are immutable: a decision holding the old one keeps its (snapshot, revision).
    assert before is not None and before.revision == 3 and before.snapshot is not None
    assert before.snapshot.usage_table()["GPU-a"]["used"] == 0


def test_old_update_is_ignored() -> None:
    state = fresh_at(3)
    state.apply_update(update(3, usage(5)))
    state.apply_update(update(2, usage(5)))
    current = state.view("node-1")
    assert current is not None and current.revision == 3
    assert state.is_fresh("node-1")


def test_a_gap_applies_the_update_but_leaves_the_node_unconfirmed() -> None:
    # Two commits close together publish revisions 4 and 5 as two updates of revision 5: the
    # table is the node's latest, but a change it does not show may hide in the gap.
    state = fresh_at(3)
    state.apply_update(update(5))
    current = state.view("node-1")
    assert current is not None and current.revision == 5
    assert current.snapshot is not None and current.snapshot.usage_table()["GPU-a"]["used"] == 1
    assert state.is_fresh("node-1") and state.to_fetch(["node-1"]) == []  # decide on it
    assert state.unconfirmed(["node-1", "node-1", "made-up"]) == ["node-1"]  # refuse: fetch
    # An in-order update does not confirm it (the hidden change would still be hidden).
    state.apply_update(update(6, usage(2)))
    assert state.unconfirmed(["node-1"]) == ["node-1"]
    # Accounting's snapshot does.
    state.apply_snapshot("e1", [view(6, used=2)], full=False, asked="node-1")
    assert state.unconfirmed(["node-1"]) == []


def test_unchanged_usage_leaves_the_node_unconfirmed() -> None:
    # A cordon or register change bumps the revision without touching usage (so do a bind
    # phase and a consume).
    state = fresh_at(3)
    state.apply_update(update(4, usage(0)))
    assert state.is_fresh("node-1") and state.unconfirmed(["node-1"]) == ["node-1"]
    fresh = fresh_at(3)
    fresh.apply_update(update(4, usage(1)))  # in order, usage changed: nothing hidden
    assert fresh.unconfirmed(["node-1"]) == []


def test_other_device_set_marks_the_node_stale() -> None:
    for table in ({"GPU-b": UsageEntry(used=1, usedmem=0, usedcores=0)}, {}):
        state = fresh_at(3)
        state.apply_update(update(4, table))
        assert not state.is_fresh("node-1"), table


def test_an_update_for_a_node_without_inventory_marks_it_stale() -> None:
    state = Freshness()
    state.apply_snapshot("e1", [NodeView("node-1", 3, None)], full=True)
    state.apply_update(update(4))
    assert state.needs_fetch("node-1")


def test_unknown_node_and_new_epoch() -> None:
    state = fresh_at(3)
    state.apply_snapshot("e1", [view(2, "node-2")], full=False)
    state.apply_update(update(1, node="node-9"))
    assert not state.is_fresh("node-9") and state.needs_fetch("node-9")
    # A new epoch is per node (a takeover publishes each node of its partition under it): that
    # node is fetched, the others stay as they are, nothing asks for a full snapshot.
    state.apply_update(update(1, epoch="e2"))
    assert state.needs_fetch("node-1") and not state.needs_full
    assert state.is_fresh("node-2")


def test_expected_revision_after_a_commit() -> None:
    state = fresh_at(3)
    state.expect("node-1", 5)
    state.expect("node-1", 4)  # never lowered
    assert not state.is_fresh("node-1")
    state.apply_update(update(4, usage(1)))
    assert not state.is_fresh("node-1")
    state.apply_update(update(5, usage(2)))
    assert state.is_fresh("node-1")


FULL = usage(10, 40000, 100)
"""GPU-a taken whole: what a forged or buggy update claims."""


def used(state: Freshness, node: str = "node-1") -> tuple[int, int] | None:
    """(revision, GPU-a's used count) of the node's view."""
    current = state.view(node)
    if current is None or current.snapshot is None:
        return None
    return current.revision, current.snapshot.usage_table()["GPU-a"]["used"]


def test_a_snapshot_overrules_an_update_ahead_of_it_seen_before_it_was_asked() -> None:
    # A forged update at revision+1 says the GPU is full. Accounting answered the snapshot
    # after it was seen, so its lower revision proves the update impossible: the snapshot
    # wins, for a node snapshot and a full one alike.
    for full in (False, True):
        state = fresh_at(3)
        state.apply_update(update(4, FULL))
        assert used(state) == (4, 10) and state.is_fresh("node-1")
        # (No `sent`: the request went out just now, after every update seen.)
        overruled = state.apply_snapshot("e1", [view(3)], full=full, asked="node-1")
        assert overruled == ["node-1"]
        assert used(state) == (3, 0), full
        assert state.is_fresh("node-1") and state.ahead_of_accounting(["node-1"]) == []


def test_an_update_that_overtook_the_snapshot_is_kept_until_a_later_snapshot_decides() -> None:
    for later in (3, 4):
        state = fresh_at(3)
        sent = state.ticket()  # the request goes out...
        state.apply_update(update(4, usage(1)))  # ...and an update arrives before its answer
        assert state.apply_snapshot("e1", [view(3)], full=False, asked="node-1", sent=sent) == []
        # Possibly a change made after accounting answered: not rolled back, but nothing has
        # confirmed it, so the node is fetched again before a decision rests on it.
        assert used(state) == (4, 1)
        assert not state.is_fresh("node-1") and state.to_fetch(["node-1"]) == ["node-1"]
        assert state.ahead_of_accounting(["node-2", "node-1", "node-1"]) == ["node-1"]
        # The next answer, asked after the update was seen, decides: it confirms it (4) or
        # proves it impossible (still 3).
        state.apply_snapshot("e1", [view(later)], full=False, asked="node-1", sent=state.ticket())
        assert used(state) == (later, 0)
        assert state.is_fresh("node-1") and state.ahead_of_accounting(["node-1"]) == []


def test_an_overtaking_update_keeps_its_node_stale_across_a_full_snapshot() -> None:
    state = fresh_at(3)
    sent = state.ticket()
    state.apply_update(update(4, usage(1)))
    state.apply_snapshot("e1", [view(3), view(1, "node-2")], full=True, sent=sent)
    assert used(state) == (4, 1) and state.needs_fetch("node-1")
    assert state.is_fresh("node-2") and not state.needs_full


def test_an_older_answer_never_rolls_back_a_newer_one() -> None:
    # Two requests in flight, answered out of order: the newer answer is accounting's own
    # word, so the older one neither rolls it back nor makes it suspect.
    state = fresh_at(3)
    first = state.ticket()
    second = state.ticket()
    state.apply_snapshot("e1", [view(5)], full=False, asked="node-1", sent=second)
    assert state.apply_snapshot("e1", [view(4)], full=False, asked="node-1", sent=first) == []
    assert used(state) == (5, 0) and state.is_fresh("node-1")


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(1, 5),
    updates=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 10)), max_size=8),
    answer=st.integers(0, 9),
)
def test_a_snapshot_asked_after_every_update_is_what_the_node_holds(
    start: int, updates: list[tuple[int, int]], answer: int
) -> None:
    """Whatever updates came before the request (in order, out of order, forged), the answer
    is the view, and the node is fresh."""
    state = fresh_at(start)
    for revision, count in updates:
        state.apply_update(update(revision, usage(count)))
    state.apply_snapshot("e1", [view(answer)], full=False, asked="node-1", sent=state.ticket())
    assert used(state) == (answer, 0)
    assert state.is_fresh("node-1") and state.ahead_of_accounting(["node-1"]) == []


def test_a_snapshot_clears_stale_and_a_full_one_forgets_the_rest() -> None:
    state = fresh_at(3)
    state.apply_snapshot("e1", [view(1, "node-2")], full=False)
    state.invalidate("node-1")
    state.invalidate("node-2")
    state.apply_snapshot("e1", [view(4)], full=False, asked="node-1")
    assert state.is_fresh("node-1") and state.needs_fetch("node-2")
    state.apply_snapshot("e1", [view(4)], full=True)
    assert state.view("node-2") is None and not state.needs_fetch("node-2")


def test_a_node_snapshot_of_a_new_epoch_replaces_that_node_only() -> None:
    state = fresh_at(3)
    state.apply_snapshot("e1", [view(2, "node-2")], full=False)
    state.expect("node-1", 9)
    state.apply_snapshot("e2", [view(1)], full=False, asked="node-1")
    # Revisions of the previous run mean nothing: the lower revision is taken, not refused,
    # and the revision a commit answered under the old epoch is no longer awaited.
    current = state.view("node-1")
    assert current is not None and current.revision == 1 and current.epoch == "e2"
    assert state.is_fresh("node-1") and state.epoch == "e2"
    # The other nodes' epochs are their own (a takeover publishes each node it took over).
    assert state.is_fresh("node-2") and not state.needs_full


def test_a_node_accounting_does_not_know_is_absent_not_stale() -> None:
    state = fresh_at(3)
    state.apply_update(update(1, node="node-2"))
    assert state.needs_fetch("node-2")
    state.apply_snapshot("e1", [], full=False, asked="node-2")
    assert not state.needs_fetch("node-2") and state.view("node-2") is None


def test_a_deleted_node_is_dropped() -> None:
    state = fresh_at(3)
    state.expect("node-1", 4)
    state.apply_update(update(4, {}, deleted=True))
    assert state.view("node-1") is None and len(state) == 0
    assert not state.needs_fetch("node-1")  # gone, not stale: no fetch is asked for it


def test_names_nobody_announced_are_absent_not_stale() -> None:
    state = fresh_at(3)
    # A filter naming made-up nodes asks accounting nothing about them...
    assert not state.needs_fetch("made-up-1")
    # ...until accounting announces the node (a Node created after the last snapshot).
    state.apply_update(update(1, usage(0), node="node-2"))
    assert state.needs_fetch("node-2")
    # An update naming something that is no node name is ignored.
    state.apply_update(update(1, usage(0), node="x" * 300))
    assert not state.needs_fetch("x" * 300)


def test_invalidate_all_asks_for_a_full_fetch() -> None:
    state = fresh_at(3)
    state.invalidate_all()
    assert state.needs_full
    assert state.is_fresh("node-1")  # the views stay usable until it lands


def test_quota_without_limits_is_trusted_for_a_while_limited_never() -> None:
    state = Freshness()
    free = QuotaLedger({"ml": QuotaLimit()}, {})
    state.remember_quota("ml", free, now=100.0)
    assert state.cached_quota("ml", now=100.0 + QUOTA_TTL) is free
    assert state.cached_quota("ml", now=100.1 + QUOTA_TTL) is None
    state.forget_quota("ml")
    assert state.cached_quota("ml", now=100.0) is None
    limited = QuotaLedger({"ml": QuotaLimit(mem=1000)}, {})
    state.remember_quota("ml", limited, now=100.0)
    assert state.cached_quota("ml", now=100.0) is None
    assert state.cached_quota("other", now=100.0) is None


def test_an_applied_update_carries_the_nodes_lock() -> None:
    from shared.core.lock import Lock
    from shared.messages import LockWire

    state = fresh_at(3)
    held = Lock("ml/a", "uid-a", 100)
    state.apply_update(
        UsageUpdate(
            epoch="e1",
            node="node-1",
            revision=4,
            devices=usage(1, 5000, 10),
            allocating=LockWire.from_core(held),
        )
    )
    current = state.view("node-1")
    assert current is not None and current.lock == held
    state.apply_update(update(5, usage(2, 10000, 20)))
    current = state.view("node-1")
    assert current is not None and current.revision == 5 and current.lock is None


def test_locked_nodes_leave_out_the_holder_and_expired_locks() -> None:
    from shared.core.lock import NODE_LOCK_EXPIRY_SECONDS, Lock
    from svc_scheduler.extender_place import locked_nodes

    snapshot = view(1).snapshot
    views = {
        "held": NodeView("held", 1, snapshot, Lock("ml/a", "uid-a", 1000)),
        "expired": NodeView("expired", 1, snapshot, Lock("ml/c", "uid-c", 998)),
        "free": NodeView("free", 1, snapshot),
        "unknown": None,
    }
    now = 1000 + NODE_LOCK_EXPIRY_SECONDS - 1
    assert locked_nodes(views, "uid-b", now) == {"held": "node is still allocating pod ml/a"}
    assert locked_nodes(views, "uid-a", now) == {}


@settings(max_examples=300, deadline=None)
@given(
    known=st.dictionaries(st.sampled_from(NAMES), st.integers(1, 6), max_size=len(NAMES)),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["expect", "invalidate", "drop", "snapshot"]),
            st.sampled_from(NAMES),
            st.integers(1, 8),
        ),
        max_size=12,
    ),
    asked=st.lists(st.sampled_from(NAMES), max_size=12),
)
def test_to_fetch_is_every_asked_node_that_needs_a_fetch_once_in_order(
    known: dict[str, int], steps: list[tuple[str, str, int]], asked: list[str]
) -> None:
    """The filter's quick way through (only nodes with a commit not yet seen, when nothing is
    stale) gives what asking `needs_fetch` of every name gives."""
    state = Freshness()
    state.apply_snapshot("e1", [view(r, node=n) for n, r in known.items()], full=True)
    for step, name, revision in steps:
        if step == "expect":
            state.expect(name, revision)
        elif step == "invalidate":
            state.invalidate(name)
        elif step == "drop":
            state.drop(name)
        else:
            state.apply_snapshot("e1", [view(revision, node=name)], full=False)
    expected = [n for n in dict.fromkeys(asked) if state.needs_fetch(n)]
    assert state.to_fetch(asked) == expected
    assert state.to_fetch(iter(asked)) == expected  # an iterator is read once
    assert state.views_of(asked) == {n: state.view(n) for n in asked}
