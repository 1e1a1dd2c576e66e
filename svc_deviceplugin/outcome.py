"""The outcome of one GetPreferredAllocation container request, as one pure function.

`decide()` turns what the allocator learnt (the mismatch, the pod's mode, whether a refit may
be asked, the refit's reply or timeout, whether a committed move maps to kubelet's replicas)
into one `PreferredOutcome`; `EFFECTS` says, for each, everything the allocator does with it: the
`result` label of `numafit_deviceplugin_refits_total{mode,result}`, the outcome recorded for
`numafit simulate`, the log line, and whether kubelet's choice is kept (a fallback, remembered
as a fallback container at Allocate) or the admission fails. Nothing else decides these.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from shared.codes import Code
from shared.core.pods import Alignment

if TYPE_CHECKING:
    from collections.abc import Mapping

    from shared.messages import RefitReply


class PreferredOutcome(enum.Enum):
    NO_MISMATCH = enum.auto()
    """Every reserved GPU has an allowed replica: the reservation is preferred."""
    NOT_OPTED_IN = enum.auto()
    """A mismatch, but no refit: the pod did not opt in (or refits are off, or MIG mode)."""
    MOVED = enum.auto()
    ALREADY_ALIGNED = enum.auto()
    FALLBACK = enum.auto()
    """Best-effort, no usable reply (no responders, transport error, unreadable reply)."""
    REFUSED = enum.auto()
    """Best-effort, the refit service refused: kubelet picks."""
    TIMEOUT = enum.auto()
    """Best-effort, no answer within the call's budget: kubelet picks."""
    STRICT_FAILED = enum.auto()
    """Strict, refused or no usable reply: the admission fails."""
    STRICT_TIMEOUT = enum.auto()
    """Strict, no answer within the call's budget: the admission fails."""
    UNMAPPABLE = enum.auto()
    """Best-effort, the move is committed but kubelet cannot honour it: the admission fails."""
    STRICT_UNMAPPABLE = enum.auto()
    """Strict, the move is committed but kubelet cannot honour it: the admission fails."""
    FALLBACK_REFUSED = enum.auto()
    """An opted-in pod left to kubelet's GPUs (refit refused, unanswered, timed out, or not
    asked), and no offered GPU satisfies its own constraints: the admission fails."""


class Then(enum.Enum):
    """What GetPreferredAllocation answers for the container."""

    SELECT = "select"
    """The selection (the reservation's, or the refit's)."""
    KUBELET = "kubelet"
    """Nothing: kubelet picks."""
    FALLBACK = "fallback"
    """Nothing, and the container is counted as a fallback container once allocated."""
    FAIL = "fail"
    """Bind-phase `failed` is recorded and the admission fails."""


@dataclass(frozen=True, slots=True)
class Effect:
    result: str
    """The metric's `result` label."""
    record: str
    """What `numafit simulate` reports (`{code}`: the refusal's bounded code; `{prior}`: the
    record of the outcome this one replaced)."""
    then: Then
    level: int = logging.INFO
    message: str | None = None
    """The log line (None: none)."""
    detail: str = "cause"
    """The log field carrying the detail (the cause, the mismatch, the code)."""
    refusal: str = ""
    """The admission error (`{detail}`: the cause), when `then` is FAIL."""
    own_mode: bool = True
    """The metric's `mode` label is the pod's (else `none`)."""


_FALLBACK = "refit fallback: kubelet picks"
_STRICT = "strict refit failed"
_STRICT_REFUSAL = "numa-alignment strict: {detail}"
_UNMAPPABLE = "refit committed but unmappable"
_UNMAPPABLE_REFUSAL = "numa refit committed but kubelet cannot honor the selection: {detail}"
_FALLBACK_REFUSED = "fallback refused: no offered GPU satisfies the pod"

EFFECTS: Final[Mapping[PreferredOutcome, Effect]] = {
    PreferredOutcome.NO_MISMATCH: Effect("no_mismatch", "none", Then.SELECT),
    PreferredOutcome.NOT_OPTED_IN: Effect(
        "not_opted_in",
        "none",
        Then.KUBELET,
        message="mismatch, no refit",
        detail="error",
        own_mode=False,
    ),
    PreferredOutcome.MOVED: Effect(
        "moved", "moved", Then.SELECT, message="NUMA refit succeeded", detail="code"
    ),
    PreferredOutcome.ALREADY_ALIGNED: Effect(
        "already_aligned",
        "already_aligned",
        Then.SELECT,
        message="NUMA refit succeeded",
        detail="code",
    ),
    PreferredOutcome.FALLBACK: Effect("fallback", "fallback", Then.FALLBACK, message=_FALLBACK),
    PreferredOutcome.REFUSED: Effect(
        "fallback", "refused:{code}", Then.FALLBACK, message=_FALLBACK
    ),
    PreferredOutcome.TIMEOUT: Effect("timeout", "timeout", Then.FALLBACK, message=_FALLBACK),
    PreferredOutcome.STRICT_FAILED: Effect(
        "strict_failed",
        "strict_failed",
        Then.FAIL,
        logging.ERROR,
        _STRICT,
        refusal=_STRICT_REFUSAL,
    ),
    PreferredOutcome.STRICT_TIMEOUT: Effect(
        "timeout", "strict_failed", Then.FAIL, logging.ERROR, _STRICT, refusal=_STRICT_REFUSAL
    ),
    PreferredOutcome.UNMAPPABLE: Effect(
        "unmappable",
        "refused:unmappable",
        Then.FAIL,
        logging.ERROR,
        _UNMAPPABLE,
        "error",
        _UNMAPPABLE_REFUSAL,
    ),
    PreferredOutcome.STRICT_UNMAPPABLE: Effect(
        "unmappable",
        "strict_failed",
        Then.FAIL,
        logging.ERROR,
        _UNMAPPABLE,
        "error",
        _UNMAPPABLE_REFUSAL,
    ),
    PreferredOutcome.FALLBACK_REFUSED: Effect(
        "fallback_refused",
        "{prior}",
        Then.FAIL,
        logging.ERROR,
        _FALLBACK_REFUSED,
        refusal="numa-alignment {mode}: no GPU kubelet offers satisfies the pod: {detail}",
    ),
}


def decide(
    *,
    mismatch: bool,
    mode: Alignment | None,
    refit_allowed: bool = True,
    reply: RefitReply | None = None,
    timed_out: bool = False,
    mappable: bool = True,
) -> PreferredOutcome:
    """The outcome of one container request.

    `mismatch`: a reserved GPU has no allowed replica. `mode`: the pod's valid
    `hami.io/numa-alignment` (None: absent or invalid). `refit_allowed`: refits are enabled
    and the node is not in MIG mode. `reply`: the refit's reply (None: none, or unreadable);
    `timed_out`: no reply within the budget. `mappable`: a successful reply's devices map to
    kubelet's replicas."""
    if not mismatch:
        return PreferredOutcome.NO_MISMATCH
    if mode is None or not refit_allowed:
        return PreferredOutcome.NOT_OPTED_IN
    strict = mode is Alignment.STRICT
    if reply is not None and reply.succeeded:
        if not mappable:
            return PreferredOutcome.STRICT_UNMAPPABLE if strict else PreferredOutcome.UNMAPPABLE
        aligned = Code.parse(reply.code, Code.MOVED) is Code.ALREADY_ALIGNED
        return PreferredOutcome.ALREADY_ALIGNED if aligned else PreferredOutcome.MOVED
    if timed_out:
        return PreferredOutcome.STRICT_TIMEOUT if strict else PreferredOutcome.TIMEOUT
    if strict:
        return PreferredOutcome.STRICT_FAILED
    return PreferredOutcome.FALLBACK if reply is None else PreferredOutcome.REFUSED


def judged(outcome: PreferredOutcome, mode: Alignment | None, satisfied: bool) -> PreferredOutcome:
    """An outcome leaving the container to kubelet's GPUs, once the fallback rule judged them
    (`shared.core.fallback`): an opted-in pod none of whose offered GPUs satisfies its own
    constraints is refused (best-effort gives up NUMA alignment, not those); a pod that did not
    opt in keeps HAMi's behaviour (kubelet's choice runs, accounting follows it)."""
    if satisfied or mode is None or EFFECTS[outcome].then not in (Then.KUBELET, Then.FALLBACK):
        return outcome
    return PreferredOutcome.FALLBACK_REFUSED


def mode_label(outcome: PreferredOutcome, mode: Alignment | None) -> str:
    """The metric's `mode` label."""
    return mode.value if mode is not None and EFFECTS[outcome].own_mode else "none"
