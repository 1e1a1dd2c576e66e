"""Fault injection: make chosen requests slow or failing, to test clients' error paths.

A rule matches by HTTP method and a regular expression searched in the path and query string;
it delays the request (with asyncio, so every other request proceeds meanwhile) and/or answers
it with a Status of the given code instead of serving it, for its first `times` matches or for
every match. The first live rule that matches a request applies; rules are added in-process
(`emulator.faults.add(...)`) or over HTTP (`POST /_emulator/faults`, see server.py).
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from . import errors
from .objects import JSONDict

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
        try:
            self._pattern = re.compile(self.path_regex)
        except re.error as error:
            raise ValueError(f"path_regex does not compile: {error}") from None

    def matches(self, method: str, path_qs: str) -> bool:
        return (self.method is None or self.method == method) and bool(
            self._pattern.search(path_qs)
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
            "hits": self.hits,
        }


class Faults:
    """The live fault rules, in the order they were added."""

    def __init__(self) -> None:
        self._rules: list[FaultRule] = []
        self._ids = itertools.count(1)

    def add(
        self,
        *,
        path_regex: str = "",
        method: str | None = None,
        delay_s: float = 0.0,
        status: int | None = None,
        times: int | None = None,
        message: str = "injected fault",
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
        }
        for key, value in body.items():
            if key not in types:
                raise ValueError(f"unknown fault rule field: {key}")
            if isinstance(value, bool) or not isinstance(value, types[key]):
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

    def take(self, method: str, path_qs: str) -> FaultRule | None:
        """The rule that applies to this request, counted as used (and retired when spent)."""
        for rule in self._rules:
            if rule.matches(method, path_qs):
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
        rule = self.take(request.method, request.path_qs)
        if rule is not None:
            if rule.delay_s:
                await asyncio.sleep(rule.delay_s)
            if rule.status is not None:
                raise errors.from_code(rule.status, rule.message)
        return await handler(request)
