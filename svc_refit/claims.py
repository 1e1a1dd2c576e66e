"""Moves in flight, and waits for a node's next change.

A sent move is a *claim*: the capacity it takes is counted for every other refit on the node
until its outcome is known, so a burst for three free slots sends three moves, not two hundred.
A refit refused only because of claims waits for the node's next change (a claim settling, a
usage update, a snapshot) and decides again: capacity a failed move gave back is never
refused. The read model pulses a node on every change of its own; a claim pulses as it
settles."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core.nodes import with_added

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from shared.core.model import NodeSnapshot, Usage


@dataclass(slots=True)
class Claim:
    pod_uid: str
    usage: Mapping[str, Usage]
    """What the move adds on each device (slots already counted per pod, as d.2 does)."""


class Claims:
    """The claims on each node, and the waiters for each node's next change."""

    def __init__(self) -> None:
        self._claims: dict[str, dict[int, Claim]] = {}
        self._claim_ids = itertools.count()
        self._pulses: dict[str, asyncio.Event] = {}
        self._waiting: dict[str, int] = {}

    @contextlib.contextmanager
    def claim(self, node: str, pod_uid: str, usage: Mapping[str, Usage]) -> Iterator[None]:
        """Count `usage` for every other refit on `node` while the move is in flight."""
        claims = self._claims.setdefault(node, {})
        key = next(self._claim_ids)
        claims[key] = Claim(pod_uid, usage)
        try:
            yield
        finally:
            claims.pop(key, None)
            if not claims:
                self._claims.pop(node, None)
            self.pulse(node)

    def moving(self, node: str, pod_uid: str) -> bool:
        """Is a move of `pod_uid` on `node` in flight (sent, its reply not applied yet)?"""
        return any(c.pod_uid == pod_uid for c in self._claims.get(node, {}).values())

    def of(self, node: str, excluding: str) -> list[Claim]:
        """The claims on `node` of every pod but `excluding`."""
        return [c for c in self._claims.get(node, {}).values() if c.pod_uid != excluding]

    def pulse(self, node: str) -> None:
        """Something about `node` changed: wake its waiters."""
        event = self._pulses.pop(node, None)
        if event is not None:
            event.set()

    async def wait_change(self, node: str, within: float) -> bool:
        """Wait until something about `node` changes (an update, a claim settles); False when
        `within` seconds passed first."""
        if within <= 0:
            return False
        event = self._pulses.get(node)
        if event is None:
            event = self._pulses[node] = asyncio.Event()
        self._waiting[node] = self._waiting.get(node, 0) + 1
        try:
            async with asyncio.timeout(within):
                await event.wait()
        except TimeoutError:
            return False
        finally:
            left = self._waiting[node] - 1
            if left:
                self._waiting[node] = left
            else:
                del self._waiting[node]
                if self._pulses.get(node) is event:
                    del self._pulses[node]  # nobody waits on it any more
        return True


def with_claims(usage: NodeSnapshot, claims: list[Claim]) -> NodeSnapshot:
    """A copy of `usage` with every claim counted."""
    return with_added(usage, (claim.usage for claim in claims))
