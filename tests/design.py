"""Facts of the handout's DESIGN.md that tests check against, written down once (by hand, from
the document, never from the code under test)."""

from __future__ import annotations

DESIGN_REFIT_CODES = (
    "moved",
    "already_aligned",
    "invalid_request",
    "unknown_device_type",
    "unsupported_device_type",
    "pod_not_tracked",
    "pod_mismatch",
    "node_mismatch",
    "container_out_of_range",
    "container_name_mismatch",
    "annotation_invalid",
    "nothing_pending",
    "nothing_recorded",
    "heterogeneous_reservation",
    "node_unavailable",
    "mig_unsupported",
    "invalid_scoring_weights",
    "no_fit",
    "quota_exceeded",
    "conflict",
    "deadline_exceeded",
    "api_error",
    "unauthorized",
)
"""DESIGN.md, "Fixed contracts": a refit reply's codes."""

DESIGN_REFIT_SUCCESS = ("moved", "already_aligned")
DESIGN_REFIT_FAILURES = frozenset(DESIGN_REFIT_CODES) - set(DESIGN_REFIT_SUCCESS)
