"""Which requesters accounting may answer itself.

A landed move's answer goes from accounting straight to the device plugin's inbox (the move
names it: `answerTo`). Whether accounting may publish there is the broker's call (the sample
configuration grants each node's inbox prefix); a refused publish is only reported back, later,
as a permissions violation. So accounting answers a prefix (the inbox subject's first token:
`_INBOX_node-1`, or `_INBOX`) on trust only once it knows: the first answer to an unknown
prefix is followed by a flush, and nats-server reports a violation before the flush's PONG. Until
then, and for a prefix the server refused, the move's reply says `answered` is not known and
the refit sends the requester its own copy of the answer.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from shared.service import natsconn
from shared.service.logs import log_field

if TYPE_CHECKING:
    from nats.aio.client import Client

log = logging.getLogger("numafit.accounting")

MAX_PREFIXES = 16384
"""Prefixes remembered (one per GPU node with per-node inboxes); the oldest go first."""
CHECK_TIMEOUT = 5
"""Seconds the flush that settles an unknown prefix may take."""
_VIOLATION = re.compile(r'permissions violation for publish to "?([^"\s]+)"?', re.IGNORECASE)


def prefix_of(subject: str) -> str:
    return subject.split(".", 1)[0]


class AnswerRelay:
    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.watching = False
        """Told the connection's errors (`watch`): without them nothing is ever trusted."""
        self._known: dict[str, bool] = {}
        """By prefix: True when the broker took an answer there, False when it refused one."""
        self._checking: set[str] = set()

    def watch(self) -> None:
        """Follow the connection's errors (a connection made by shared.service.natsconn)."""
        try:
            natsconn.on_error(self.nc, self.note_error)
        except ValueError:
            log.info("answer relay not watching its connection: the refit answers every time")
            return
        self.watching = True

    def allowed(self, subject: str) -> bool | None:
        """May accounting answer on `subject`: known yes, known no, or not known yet."""
        return self._known.get(prefix_of(subject))

    def needs_check(self, subject: str) -> bool:
        """True once per unknown prefix (until its check ends): the caller checks it."""
        prefix = prefix_of(subject)
        if not self.watching or prefix in self._known or prefix in self._checking:
            return False
        self._checking.add(prefix)
        return True

    async def check(self, subject: str) -> None:
        """After a publish to `subject`: did the broker refuse it? A violation arrives before
        the PONG of this flush; none means the prefix is granted."""
        prefix = prefix_of(subject)
        try:
            await self.nc.flush(timeout=CHECK_TIMEOUT)
        except Exception as exc:  # disconnected, slow: not known yet, asked again next time
            log.debug("answer relay check failed", extra={"prefix": prefix, "error": repr(exc)})
            return
        finally:
            self._checking.discard(prefix)
        if prefix not in self._known:
            self._remember(prefix, True)

    def note_error(self, text: str) -> None:
        """A connection error: a refused publish to an answer's subject settles its prefix.
        nats-py reports the subject lower-cased, so every prefix that reads the same in lower
        case is taken as refused (the safe side: the refit then answers there too)."""
        found = _VIOLATION.search(text)
        if found is None:
            return
        refused = prefix_of(found.group(1)).lower()
        for prefix in [*self._known, *self._checking]:
            if prefix.lower() != refused or self._known.get(prefix) is False:
                continue
            log.warning(
                "the broker refuses accounting's answers to this inbox prefix: the refit "
                "answers there itself (grant accounting publish on <prefix>.> to save a hop)",
                extra={"prefix": log_field(prefix)},
            )
            self._remember(prefix, False)

    def _remember(self, prefix: str, allowed: bool) -> None:
        self._known.pop(prefix, None)
        self._known[prefix] = allowed
        while len(self._known) > MAX_PREFIXES:
            del self._known[next(iter(self._known))]
