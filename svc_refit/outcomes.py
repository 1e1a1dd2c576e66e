"""The refit's outcomes that are not a core decision: a reply to a request that could not be
read, a refusal of svc_refit's own (deadline, accounting unavailable), accounting's refusal
carried over, and the bound on every text a reply carries."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared import codes
from shared.codes import Code
from shared.core.refit import Event, RefitDecision, refused
from shared.messages import RefitReply

if TYPE_CHECKING:
    from collections.abc import Mapping

    from shared.core.model import ContainerEntry

MAX_REASON = 512
"""Longest failureReason a reply carries (anything echoed from input is cut well before)."""


def cut(text: str, limit: int = MAX_REASON) -> str:
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text)} characters)"


def fit_reasons(value: Mapping[str, int] | None) -> dict[str, int]:
    """accounting's `fitReasons` (typed by the decoder), kept only when bounded (names are
    HAMi's, a few)."""
    if value is None or len(value) > 32:
        return {}
    return {k: v for k, v in value.items() if len(k) <= 64}


def from_accounting(
    code: Code,
    message: str,
    fit_reasons: dict[str, int] | None = None,
    previous: ContainerEntry = (),
) -> RefitDecision:
    """A refit refusal for accounting's refusal `code` (a success code here is an error)."""
    known = Code.API_ERROR if code in codes.SUCCESS else code
    return refused(known, message, fit_reasons=fit_reasons or {}, previous_devices=previous)


def invalid(message: str) -> RefitReply:
    return RefitReply(succeeded=False, code=Code.INVALID_REQUEST.value, failure_reason=message)


def failed(code: Code, message: str) -> RefitDecision:
    return RefitDecision(
        False, code, failure_reason=message, event=Event("Warning", "NumaRefitFailed", message)
    )
