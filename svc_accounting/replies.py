"""What an accounting operation answers, and the state of one request while it is served.

`Refused` carries a refusal's code up to the reply; `Outcome` is a served request's reply and
the nodes whose ledger changed (to publish); `Call` is one request's own state (its node, its
deadline, the nodes its writes and re-reads changed), passed down explicitly to every step
that needs it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from shared.codes import Code
from shared.service.lifecycle import Deadline

if TYPE_CHECKING:
    from collections.abc import Mapping

    from shared.messages import AccountingReply, AccountingRequest

MAX_ERROR_LENGTH = 300
"""Error texts in replies (and log lines) are cut to this many characters."""


def bounded(message: str, limit: int = MAX_ERROR_LENGTH) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."


class Refused(Exception):
    """An operation refused with one of the reply codes (docs/reference/messages.md;
    `fit_reasons`, HAMi's reason names with counts, go into a reserve or move reply)."""

    def __init__(
        self, code: Code, message: str, *, fit_reasons: Mapping[str, int] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.fit_reasons = fit_reasons


class ReadTooLate(Exception):
    """The request's deadline had passed before it was read: its caller gave up on it, and
    another replica may have answered it while this one was paused, so it gets no answer."""


class Unanswerable(Exception):
    """Nothing true can be said any more: this replica lost the node's partition while it
    settled a write (it was paused), and the pod changed meanwhile, so whether its write
    landed before that is not known here. No answer (the caller's deadline has long passed);
    the next owner's ledger, built from the API server, has what landed."""


class Stale(Exception):
    """409: the pod changed since the resourceVersion the write was based on."""


@dataclass
class Outcome:
    reply: AccountingReply
    changed: set[str]

    @property
    def code(self) -> Code:
        return Code(self.reply.code)


@dataclass
class Call:
    """One request while it is served: the node it is for (its writes are allowed only while
    this replica owns the node's partition; empty for a snapshot of every node, or for work
    of accounting's own), its deadline (None: only the write cap bounds each step), and the
    nodes whose ledger changed while serving it (writes and re-reads), published after it."""

    node: str = ""
    deadline: Deadline | None = None
    observed: set[str] = field(default_factory=set)

    def note(self, changed: set[str]) -> None:
        self.observed |= changed


def deadline_of(request: AccountingRequest, received: float | None) -> Deadline | None:
    """The request's deadline on this replica's monotonic clock: the earlier of `deadlineMs`
    counted from when the request was received (not from when it is served: a request kept
    through a takeover has less time left) and `deadlineAtMs`, the caller's absolute deadline
    (which also covers the time the request spent unread, in a paused process's socket)."""
    now = time.monotonic()
    found: list[float] = []
    if request.deadline_ms is not None:
        found.append((now if received is None else received) + request.deadline_ms / 1000.0)
    if request.deadline_at_ms is not None:
        found.append(now + request.deadline_at_ms / 1000.0 - time.time())
    return Deadline(min(found)) if found else None


def refuse_late(deadline: Deadline, op: str) -> NoReturn:
    """A request whose deadline has passed changes nothing: its caller gave up on it."""
    late = time.monotonic() - deadline.at
    raise Refused(
        Code.DEADLINE_EXCEEDED,
        f"the {op} request reached its deadline before it was served ({late * 1000:.0f} ms "
        "late: a paused replica, a takeover, or clocks apart); nothing was done",
    )
