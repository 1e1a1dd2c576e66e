"""Fault injection: make chosen requests slow or failing, to test clients' error paths.

A rule matches by HTTP method, a regular expression searched in the path and query string, and
optionally by whether the request is a watch (`watch: true`) or not (`watch: false`, e.g. to
fail a relist but not the watch beside it); it delays the request (with asyncio, so every other
request proceeds meanwhile) and/or answers it with a Status of the given code instead of serving
it, for its first `times` matches or for every match. The first live rule that matches a request
applies; rules are added in-process (`emulator.faults.add(...)`) or over HTTP
(`POST /_emulator/faults`, see server.py).

A delayed request is abandoned when its client disconnects during the delay, unless the rule
says `outlive_client: true`: then it is still served after the delay, as the API server commits
a write whose client went away (a writer killed mid-request, a client-side timeout). `in_flight`
counts faulted requests still being delayed or served, so a test can wait for them to settle.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from . import errors, paths

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .objects import JSONDict

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ADMIN_PREFIX = "/_emulator/"
"""Requests under this prefix (the emulator's own controls) are never faulted."""


@dataclass
class FaultRule:
    id: int
    path_regex: str
    method: str | None = None
    delay_s: float = 0.0
    status: int | None = None
    message: str = "injected fault"
    times: int | None = None
    """How many more matching requests it applies to; None for all of them."""
    watch: bool | None = None
    """Only watch requests (True), only other requests (False), or both (None)."""
    outlive_client: bool = False
    """Serve the delayed request even when its client disconnects during the delay."""
    hits: int = 0
    _pattern: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.method is not None:
            self.method = self.method.upper()
        if self.delay_s < 0:
            raise ValueError("delay_s must not be negative")
        if self.status is not None and not 400 <= self.status <= 599:
            raise ValueError("status must be an HTTP error code (400-599)")
        if self.times is not None and self.times < 1:
            raise ValueError("times must be at least 1")
        if self.delay_s == 0 and self.status is None:
            raise ValueError("a fault needs a delay_s, a status, or both")
        if self.outlive_client and self.delay_s == 0:
            raise ValueError("outlive_client needs a delay_s")
        try:
            self._pattern = re.compile(self.path_regex)
        except re.error as error:
            raise ValueError(f"path_regex does not compile: {error}") from None

    def matches(self, method: str, path_qs: str, is_watch: bool = False) -> bool:
        return (
            (self.method is None or self.method == method)
            and (self.watch is None or self.watch == is_watch)
            and bool(self._pattern.search(path_qs))
        )

    def to_json(self) -> JSONDict:
        return {
            "id": self.id,
            "method": self.method,
            "path_regex": self.path_regex,
            "delay_s": self.delay_s,
            "status": self.status,
            "message": self.message,
            "times": self.times,
            "watch": self.watch,
            "outlive_client": self.outlive_client,
            "hits": self.hits,
        }


class Faults:
    """The live fault rules, in the order they were added."""

    def __init__(self) -> None:
        self._rules: list[FaultRule] = []
        self._ids = itertools.count(1)
        self.in_flight = 0
        """Faulted requests still being delayed or served."""
        self._outliving: set[asyncio.Task[web.StreamResponse]] = set()
        self.on_write: list[Callable[[str, str, bytes], None]] = []
        """Called with (method, path, body) of every write as it arrives, before any fault
        delays it (tests tell when a write was sent from when it was committed)."""

    def add(
        self,
        *,
        path_regex: str = "",
        method: str | None = None,
        delay_s: float = 0.0,
        status: int | None = None,
        times: int | None = None,
        message: str = "injected fault",
        watch: bool | None = None,
        outlive_client: bool = False,
    ) -> FaultRule:
        """Add a rule; raises ValueError for a rule that could never do anything sensible."""
        rule = FaultRule(
            id=next(self._ids),
            path_regex=path_regex,
            method=method,
            delay_s=delay_s,
            status=status,
            message=message,
            times=times,
            watch=watch,
            outlive_client=outlive_client,
        )
        self._rules.append(rule)
        return rule

    def add_json(self, body: object) -> FaultRule:
        """add() from the admin endpoint's JSON body, checking its types."""
        if not isinstance(body, dict):
            raise ValueError("a fault rule must be a JSON object")
        types: dict[str, tuple[type, ...]] = {
            "path_regex": (str,),
            "method": (str, type(None)),
            "delay_s": (int, float),
            "status": (int, type(None)),
            "times": (int, type(None)),
            "message": (str,),
            "watch": (bool, type(None)),
            "outlive_client": (bool,),
        }
        for key, value in body.items():
            if key not in types:
                raise ValueError(f"unknown fault rule field: {key}")
            if (isinstance(value, bool) and bool not in types[key]) or not isinstance(
                value, types[key]
            ):
                raise ValueError(f"fault rule field {key} has the wrong type")
        return self.add(**body)

    def remove(self, rule_id: int) -> bool:
        before = len(self._rules)
        self._rules = [rule for rule in self._rules if rule.id != rule_id]
        return len(self._rules) < before

    def clear(self) -> None:
        self._rules.clear()

    def rules(self) -> list[FaultRule]:
        return list(self._rules)

    def take(self, method: str, path_qs: str, is_watch: bool = False) -> FaultRule | None:
        """The rule that applies to this request, counted as used (and retired when spent)."""
        for rule in self._rules:
            if rule.matches(method, path_qs, is_watch):
                rule.hits += 1
                if rule.times is not None:
                    rule.times -= 1
                    if rule.times == 0:
                        self._rules.remove(rule)
                return rule
        return None

    @web.middleware
    async def middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        if request.path.startswith(ADMIN_PREFIX):
            return await handler(request)
        if self.on_write and request.method in WRITE_METHODS:
            body = await request.read()  # kept by the request for its handler
            for hook in self.on_write:
                hook(request.method, request.path, body)
        rule = self.take(request.method, request.path_qs, is_watch_request(request))
        if rule is None:
            return await handler(request)
        if not rule.outlive_client:
            self.in_flight += 1
            try:
                return await self._apply(rule, request, handler)
            finally:
                self.in_flight -= 1
        # Shielded: a cancellation (the client went away) stops this handler waiting, not
        # the request being served.
        self.in_flight += 1
        task = asyncio.ensure_future(self._apply(rule, request, handler))
        self._outliving.add(task)
        task.add_done_callback(self._outlived)
        return await asyncio.shield(task)

    def _outlived(self, task: asyncio.Task[web.StreamResponse]) -> None:
        self._outliving.discard(task)
        self.in_flight -= 1
        if not task.cancelled():
            task.exception()  # retrieved: a refusal nobody waits for any more is not an error

    async def _apply(
        self,
        rule: FaultRule,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        if rule.outlive_client:
            await request.read()  # kept by the request: still there once the client has gone
        if rule.delay_s:
            await asyncio.sleep(rule.delay_s)
        if rule.status is not None:
            raise errors.from_code(rule.status, rule.message)
        return await handler(request)

    async def cancel_outliving(self) -> None:
        """Stop serving requests whose clients left (the emulator is stopping)."""
        tasks = list(self._outliving)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def is_watch_request(request: web.Request) -> bool:
    """A watch: `?watch=true` (or 1) on a collection, or the legacy `/watch/` path prefix."""
    flag = request.query.get("watch")
    if flag is not None and flag.lower() in ("true", "1"):
        return True
    target = paths.parse(request.path)
    return target is not None and target.watch_prefix
