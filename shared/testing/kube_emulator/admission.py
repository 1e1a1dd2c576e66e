"""The admission hook: where the emulator calls what a real API server would call as webhooks.

The API server runs mutating and validating admission on every pod create and update before it
stores anything; numafit's own webhook (svc_scheduler) is meant to be plugged in here. A hook is
any async callable taking an AdmissionRequest. It may return a changed object (a mutation), None
to admit the object as it is, or raise AdmissionDenied to refuse the request; the client then
sees the same Status a webhook denial produces. Any other exception is a failed webhook call
(failurePolicy: Fail), answered 500.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from .objects import JSONDict

DEFAULT_WEBHOOK = "admission.kube-emulator"


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """One object on its way into the store. `object` is the hook's own copy, free to change;
    for CREATE it has no uid or resourceVersion yet (upstream assigns them after admission),
    and its name may still be empty when the client used generateName."""

    operation: Literal["CREATE", "UPDATE"]
    kind: str
    namespace: str
    name: str
    object: JSONDict
    old_object: JSONDict | None = None
    dry_run: bool = False
    """The request is a dry run (`dryRun=All`): nothing will be stored. Upstream still calls
    webhooks declaring `sideEffects: None` (numafit's does), with `dryRun: true` in the review,
    so a hook must then decide without side effects of its own."""


AdmissionHook = Callable[[AdmissionRequest], Awaitable[JSONDict | None]]


class AdmissionDenied(Exception):
    """Raised by a hook to refuse a request, like a webhook answering `allowed: false`.

    `code` and `reason` become the Status' (upstream uses 400 when a webhook sets no code).
    """

    def __init__(
        self, message: str, *, webhook: str = DEFAULT_WEBHOOK, code: int = 400, reason: str = ""
    ) -> None:
        super().__init__(message)
        self.message = message
        self.webhook = webhook
        self.code = code
        self.reason = reason
