"""The rule both read models apply when a snapshot meets a held view: accounting's snapshot is
the authority; a view ahead of it survives only when it was set while the request travelled,
and then, on an update's word only, it is fetched again."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.core.snapshot_rule import Verdict, snapshot_verdict


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
