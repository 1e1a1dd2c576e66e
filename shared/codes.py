"""Every reply code numafit sends, in one enum.

The refit contract's codes (docs/reference/refit-codes.md) plus accounting's `ok`. Accounting's
refusals use the refit's names (`conflict`, `no_fit`, `node_unavailable`, ...), so one enum
covers both. Metric labels that are no reply code (`internal_error`, `unavailable`,
`binding_failed`, ...) are deliberately not members.

Only the standard library is imported here, so the pure core may import it too.
"""

from __future__ import annotations

import enum
from typing import Final


class Code(enum.StrEnum):
    """A reply's `code`. Values are the wire strings; `shared.core.refit.Code` has the same
    values for every refit code (this is a superset: it adds `ok`)."""

    OK = "ok"
    """Accounting: the operation succeeded."""
    MOVED = "moved"
    ALREADY_ALIGNED = "already_aligned"
    INVALID_REQUEST = "invalid_request"
    UNKNOWN_DEVICE_TYPE = "unknown_device_type"
    UNSUPPORTED_DEVICE_TYPE = "unsupported_device_type"
    POD_NOT_TRACKED = "pod_not_tracked"
    POD_MISMATCH = "pod_mismatch"
    NODE_MISMATCH = "node_mismatch"
    CONTAINER_OUT_OF_RANGE = "container_out_of_range"
    CONTAINER_NAME_MISMATCH = "container_name_mismatch"
    ANNOTATION_INVALID = "annotation_invalid"
    NOTHING_PENDING = "nothing_pending"
    NOTHING_RECORDED = "nothing_recorded"
    HETEROGENEOUS_RESERVATION = "heterogeneous_reservation"
    NODE_UNAVAILABLE = "node_unavailable"
    MIG_UNSUPPORTED = "mig_unsupported"
    INVALID_SCORING_WEIGHTS = "invalid_scoring_weights"
    NO_FIT = "no_fit"
    QUOTA_EXCEEDED = "quota_exceeded"
    CONFLICT = "conflict"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    API_ERROR = "api_error"
    UNAUTHORIZED = "unauthorized"

    @classmethod
    def parse(cls, text: object, default: Code | None = None) -> Code:
        """The member whose value is `text`; `default` (`API_ERROR` when not given) for
        anything else: an unknown code (a newer peer's), a non-string, None."""
        fallback = cls.API_ERROR if default is None else default
        if not isinstance(text, str):
            return fallback
        try:
            return cls(text)
        except ValueError:
            return fallback

    @property
    def succeeded(self) -> bool:
        return self in SUCCESS


SUCCESS: Final = frozenset({Code.OK, Code.MOVED, Code.ALREADY_ALIGNED})
"""Codes that report success (accounting's `ok`, the refit's `moved` and `already_aligned`)."""

FAILURE: Final = frozenset(Code) - SUCCESS
"""Every refusal code."""

REFIT_SUCCESS: Final = frozenset({Code.MOVED, Code.ALREADY_ALIGNED})
REFIT_FAILURE: Final = frozenset(FAILURE)
"""The failure codes of a refit reply (docs/reference/refit-codes.md): every refusal code is one."""
REFIT: Final = REFIT_SUCCESS | REFIT_FAILURE
"""Every code a refit reply may carry (all but `ok`)."""

ACCOUNTING: Final = frozenset(
    {
        Code.OK,
        Code.INVALID_REQUEST,
        Code.UNAUTHORIZED,
        Code.NODE_UNAVAILABLE,
        Code.POD_NOT_TRACKED,
        Code.POD_MISMATCH,
        Code.NODE_MISMATCH,
        Code.CONTAINER_OUT_OF_RANGE,
        Code.ANNOTATION_INVALID,
        Code.NOTHING_PENDING,
        Code.NO_FIT,
        Code.QUOTA_EXCEEDED,
        Code.CONFLICT,
        Code.DEADLINE_EXCEEDED,
        Code.API_ERROR,
    }
)
"""Every code an accounting reply carries today (svc_accounting/operations.py, service.py)."""

SCHEDULER_RETRY: Final = frozenset(
    {Code.CONFLICT, Code.QUOTA_EXCEEDED, Code.NODE_UNAVAILABLE, Code.NO_FIT}
)
"""A `reserve` refused with one of these lost a race: the scheduler recomputes on fresh
state (svc_scheduler/extender.py's RETRY_CODES)."""

UNCERTAIN: Final = frozenset({Code.DEADLINE_EXCEEDED, Code.API_ERROR})
"""A write refused with one of these may still have reached the API server: the caller
checks whether it landed (svc_refit's move)."""
