"""The preferred-allocation outcome: one pure function, one table of effects."""

from __future__ import annotations

import pytest

from shared.core.pods import Alignment
from shared.messages import RefitReply
from svc_deviceplugin.metrics import REFIT_RESULTS
from svc_deviceplugin.outcome import EFFECTS, PreferredOutcome, Then, decide, judged, mode_label

BE, STRICT = Alignment.BEST_EFFORT, Alignment.STRICT
MOVED = RefitReply(succeeded=True, code="moved", container_devices="GPU-a,NVIDIA,1,1:")
ALIGNED = RefitReply(succeeded=True, code="already_aligned", container_devices="GPU-a,NVIDIA,1,1:")
NEWER = RefitReply(succeeded=True, code="some_newer_success", container_devices="x")
REFUSED = RefitReply(succeeded=False, code="no_fit", failure_reason="no allowed device fits")

# mismatch, mode, refit allowed, reply, timed out, mappable -> outcome
TABLE = [
    (False, None, True, None, False, True, PreferredOutcome.NO_MISMATCH),
    (False, STRICT, False, None, False, True, PreferredOutcome.NO_MISMATCH),
    (True, None, True, None, False, True, PreferredOutcome.NOT_OPTED_IN),
    (True, BE, False, None, False, True, PreferredOutcome.NOT_OPTED_IN),
    (True, STRICT, False, None, False, True, PreferredOutcome.NOT_OPTED_IN),
    (True, BE, True, MOVED, False, True, PreferredOutcome.MOVED),
    (True, STRICT, True, MOVED, False, True, PreferredOutcome.MOVED),
    (True, BE, True, NEWER, False, True, PreferredOutcome.MOVED),
    (True, BE, True, ALIGNED, False, True, PreferredOutcome.ALREADY_ALIGNED),
    (True, STRICT, True, ALIGNED, False, True, PreferredOutcome.ALREADY_ALIGNED),
    (True, BE, True, MOVED, False, False, PreferredOutcome.UNMAPPABLE),
    (True, STRICT, True, ALIGNED, False, False, PreferredOutcome.STRICT_UNMAPPABLE),
    (True, BE, True, REFUSED, False, True, PreferredOutcome.REFUSED),
    (True, STRICT, True, REFUSED, False, True, PreferredOutcome.STRICT_FAILED),
    (True, BE, True, None, False, True, PreferredOutcome.FALLBACK),
    (True, STRICT, True, None, False, True, PreferredOutcome.STRICT_FAILED),
    (True, BE, True, None, True, True, PreferredOutcome.TIMEOUT),
    (True, STRICT, True, None, True, True, PreferredOutcome.STRICT_TIMEOUT),
]


@pytest.mark.parametrize(
    ("mismatch", "mode", "allowed", "reply", "timed_out", "mappable", "expected"), TABLE
)
def test_decide(
    mismatch: bool,
    mode: Alignment | None,
    allowed: bool,
    reply: RefitReply | None,
    timed_out: bool,
    mappable: bool,
    expected: PreferredOutcome,
) -> None:
    got = decide(
        mismatch=mismatch,
        mode=mode,
        refit_allowed=allowed,
        reply=reply,
        timed_out=timed_out,
        mappable=mappable,
    )
    assert got is expected


def test_every_outcome_is_in_the_table() -> None:
    # FALLBACK_REFUSED is not decided from the refit: the fallback rule's judgement of
    # kubelet's GPUs turns an outcome into it (`judged`).
    decided = {row[-1] for row in TABLE}
    assert decided | {PreferredOutcome.FALLBACK_REFUSED} == set(PreferredOutcome) == set(EFFECTS)


# outcome, mode, kubelet's GPUs satisfy the pod -> outcome
JUDGED = [
    (PreferredOutcome.FALLBACK, BE, True, PreferredOutcome.FALLBACK),
    (PreferredOutcome.FALLBACK, BE, False, PreferredOutcome.FALLBACK_REFUSED),
    (PreferredOutcome.REFUSED, BE, False, PreferredOutcome.FALLBACK_REFUSED),
    (PreferredOutcome.TIMEOUT, BE, False, PreferredOutcome.FALLBACK_REFUSED),
    # Refits off (or MIG): an opted-in pod keeps its constraints all the same.
    (PreferredOutcome.NOT_OPTED_IN, BE, False, PreferredOutcome.FALLBACK_REFUSED),
    (PreferredOutcome.NOT_OPTED_IN, STRICT, False, PreferredOutcome.FALLBACK_REFUSED),
    # A pod that did not opt in keeps HAMi's behaviour: kubelet's choice runs.
    (PreferredOutcome.NOT_OPTED_IN, None, False, PreferredOutcome.NOT_OPTED_IN),
    # Nothing left to kubelet: nothing to judge.
    (PreferredOutcome.MOVED, BE, False, PreferredOutcome.MOVED),
    (PreferredOutcome.STRICT_FAILED, STRICT, False, PreferredOutcome.STRICT_FAILED),
]


@pytest.mark.parametrize(("outcome", "mode", "satisfied", "expected"), JUDGED)
def test_judged(
    outcome: PreferredOutcome, mode: Alignment | None, satisfied: bool, expected: PreferredOutcome
) -> None:
    assert judged(outcome, mode, satisfied) is expected
    refused = EFFECTS[PreferredOutcome.FALLBACK_REFUSED]
    assert refused.then is Then.FAIL and refused.record.format(prior="refused:no_fit") == (
        "refused:no_fit"
    )
    assert refused.result in REFIT_RESULTS[mode_label(PreferredOutcome.FALLBACK_REFUSED, STRICT)]
    assert refused.result in REFIT_RESULTS[mode_label(PreferredOutcome.FALLBACK_REFUSED, BE)]


# outcome, mode -> (mode label, result label, recorded outcome, what kubelet gets)
EFFECTS_TABLE = [
    (PreferredOutcome.NO_MISMATCH, None, ("none", "no_mismatch", "none", Then.SELECT)),
    (PreferredOutcome.NO_MISMATCH, STRICT, ("strict", "no_mismatch", "none", Then.SELECT)),
    (PreferredOutcome.NOT_OPTED_IN, BE, ("none", "not_opted_in", "none", Then.KUBELET)),
    (PreferredOutcome.MOVED, BE, ("best-effort", "moved", "moved", Then.SELECT)),
    (
        PreferredOutcome.ALREADY_ALIGNED,
        STRICT,
        ("strict", "already_aligned", "already_aligned", Then.SELECT),
    ),
    (PreferredOutcome.FALLBACK, BE, ("best-effort", "fallback", "fallback", Then.FALLBACK)),
    (PreferredOutcome.REFUSED, BE, ("best-effort", "fallback", "refused:no_fit", Then.FALLBACK)),
    (PreferredOutcome.TIMEOUT, BE, ("best-effort", "timeout", "timeout", Then.FALLBACK)),
    (
        PreferredOutcome.STRICT_FAILED,
        STRICT,
        ("strict", "strict_failed", "strict_failed", Then.FAIL),
    ),
    (PreferredOutcome.STRICT_TIMEOUT, STRICT, ("strict", "timeout", "strict_failed", Then.FAIL)),
    (
        PreferredOutcome.UNMAPPABLE,
        BE,
        ("best-effort", "unmappable", "refused:unmappable", Then.FAIL),
    ),
    (
        PreferredOutcome.STRICT_UNMAPPABLE,
        STRICT,
        ("strict", "unmappable", "strict_failed", Then.FAIL),
    ),
]


@pytest.mark.parametrize(("outcome", "mode", "expected"), EFFECTS_TABLE)
def test_effects(
    outcome: PreferredOutcome, mode: Alignment | None, expected: tuple[str, str, str, Then]
) -> None:
    effect = EFFECTS[outcome]
    got = (
        mode_label(outcome, mode),
        effect.result,
        effect.record.format(code="no_fit"),
        effect.then,
    )
    assert got == expected


def test_every_label_pair_is_a_series_created_at_zero() -> None:
    for _, mode, _, _, _, _, outcome in TABLE:
        label = mode_label(outcome, mode)
        assert EFFECTS[outcome].result in REFIT_RESULTS[label], (outcome, label)


def test_failures_say_why() -> None:
    for outcome, effect in EFFECTS.items():
        assert (effect.then is Then.FAIL) == bool(effect.refusal), outcome
        text = effect.refusal.format(detail="X", mode="best-effort")
        assert text.endswith(": X") or not effect.refusal
        assert effect.message is not None or outcome is PreferredOutcome.NO_MISMATCH
