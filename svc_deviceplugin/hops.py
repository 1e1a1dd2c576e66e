"""One hop of a kubelet call: what every request of the plugin's (to accounting, to svc_refit)
shares. No hop starts with less than MIN_HOP_S of the call's budget left; outside text
(accounting's errors, a refit's reasons, reply codes) is bounded before it reaches a message or
a log line; a refit request is asked once, its failure told apart from its refusal. A hop
that must fail the call raises AdmissionRefused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import nats.errors

from shared import messages, subjects
from shared.codes import Code
from shared.messages import RefitReply
from shared.service import natsconn
from shared.subjects import shown

if TYPE_CHECKING:
    from nats.aio.client import Client

    from shared.accounting_client import AccountingUnavailable

MIN_HOP_S = 0.02
"""Below this much of the call's budget no hop is started: it could only end after the call."""
TEXT_LIMIT = 200
"""Characters of outside text (accounting errors, refit reasons) kept in messages and logs."""


class AdmissionRefused(Exception):
    """Fail this kubelet call (kubelet reports UnexpectedAdmissionError)."""

    def __init__(self, message: str, *, invalid_argument: bool = False) -> None:
        super().__init__(message)
        self.invalid_argument = invalid_argument


def outside_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """Outside text for a message or log line: as is when short and printable, else cut (and
    quoted) by `subjects.shown`, so unbounded input never comes back whole."""
    return text if len(text) <= limit and text.isprintable() else shown(text, limit)


def unreadable(exc: AccountingUnavailable) -> bool:
    """Accounting answered, but with a reply that does not decode."""
    return isinstance(exc.__cause__, messages.MessageError)


def code_of(text: str) -> Code | None:
    """A reply's code; None for one this build does not know (a newer peer's)."""
    try:
        return Code(text)
    except ValueError:
        return None


def code_text(text: str) -> str:
    """A reply's code for messages, logs and outcomes: bounded."""
    return text if text and len(text) <= 64 else "unknown"


@dataclass(frozen=True, slots=True)
class RefitAnswer:
    """What one refit request came to: the reply (None: none usable), why there is none,
    whether the budget ran out first."""

    reply: RefitReply | None
    failure: str = ""
    timed_out: bool = False


async def ask_refit(nc: Client, refit: messages.RefitRequest, call_ms: int) -> RefitAnswer:
    """One request, no retry, within the request's own `timeoutMs` (`call_ms`: the whole
    kubelet call's budget, for the message)."""
    try:
        msg = await natsconn.request(
            nc,
            subjects.refit(refit.node_name),
            messages.encode(refit),
            refit.timeout_ms / 1000,
        )
    except nats.errors.NoRespondersError:
        return RefitAnswer(None, "no refit service answers")
    except (nats.errors.TimeoutError, TimeoutError):
        return RefitAnswer(
            None,
            f"refit timed out: no answer within this call's {call_ms} "
            f"ms budget ({refit.timeout_ms} ms of it left for the refit)",
            timed_out=True,
        )
    except nats.errors.Error as exc:
        return RefitAnswer(None, f"refit transport error: {outside_text(str(exc))}")
    try:
        return RefitAnswer(messages.decode(msg.data, RefitReply))
    except messages.MessageError as exc:
        return RefitAnswer(None, outside_text(str(exc)))
