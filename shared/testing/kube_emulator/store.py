"""The emulator's etcd: objects by key, one global revision counter, and a bounded change log.

Like etcd under the API server, every write (to any resource) takes the next revision, which
becomes the object's `metadata.resourceVersion`; a list reports the revision it was read at; and
a watch started from a revision replays every later change from the log, in order, before
following live ones. A watch from a revision the log no longer holds fails with TooOld (the API
server's 410), which is what forces real clients to relist; `compact()` makes that testable, and
`expire_watches()` also ends the live watches with that 410 (as an API server does when a
watcher falls out of its watch cache's window).

Everything here is synchronous: within one event loop, a read-check-write sequence that does not
await is atomic, so preconditions need no locks. Objects are copied on the way in and out, so no
caller can change what is stored; entries of the change log are shared and must not be mutated.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .objects import JSONDict, copy_json, metadata

if TYPE_CHECKING:
    from collections.abc import Callable

ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]


class KeyExists(Exception):
    """create() of a key that is already stored."""


class KeyMissing(Exception):
    """update() or delete() of a key that is not stored."""


class VersionMismatch(Exception):
    """The caller's expected resourceVersion is not the stored one."""


class TooOld(Exception):
    """A watch from a revision older than the change log reaches back; str() says which."""


class TooNew(Exception):
    """A watch from a revision the store has not reached yet."""


@dataclass(frozen=True, slots=True)
class Expiry:
    """The end of a live watch the server can no longer serve: its client must relist."""

    message: str


@dataclass(frozen=True, slots=True)
class Change:
    """One committed write. `object` is the state after it (for DELETED, the last state, carrying
    the deletion's revision); `previous` the state before (None for ADDED). Shared: read only."""

    revision: int
    type: ChangeType
    bucket: str
    namespace: str
    object: JSONDict
    previous: JSONDict | None


def _key(obj: JSONDict) -> tuple[str, str]:
    meta = metadata(obj)
    return str(meta.get("namespace") or ""), str(meta["name"])


class Store:
    """Objects grouped in buckets (one per stored resource), keyed by (namespace, name)."""

    def __init__(self, history_limit: int = 10_000) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be at least 1")
        self._buckets: dict[str, dict[tuple[str, str], JSONDict]] = {}
        self._revision = 0
        self._history: deque[Change] = deque()
        self._history_limit = history_limit
        self._compacted_through = 0  # the newest revision no longer in the change log
        self._watchers: set[Watcher] = set()
        self.on_commit: list[Callable[[Change], None]] = []
        """Called with every change as it is committed, synchronously (tests time commits
        exactly: when a write landed, not when a watcher read it)."""
        self._closed = False

    @property
    def revision(self) -> int:
        """The revision of the last write: what a list made now reports."""
        return self._revision

    def get(self, bucket: str, namespace: str, name: str) -> JSONDict | None:
        stored = self._buckets.get(bucket, {}).get((namespace, name))
        return None if stored is None else copy_json(stored)

    def list(self, bucket: str, namespace: str | None = None) -> tuple[list[JSONDict], int]:
        """Copies of the bucket's objects (in one namespace, or all), by key, and the revision."""
        objects = self._buckets.get(bucket, {})
        items = [
            copy_json(objects[key])
            for key in sorted(objects)
            if namespace is None or key[0] == namespace
        ]
        return items, self._revision

    def create(self, bucket: str, obj: JSONDict) -> JSONDict:
        objects = self._buckets.setdefault(bucket, {})
        key = _key(obj)
        if key in objects:
            raise KeyExists(key)
        stored = self._stamp(obj)
        objects[key] = stored
        self._record("ADDED", bucket, key[0], stored, None)
        return copy_json(stored)

    def update(self, bucket: str, obj: JSONDict, expected_version: str) -> JSONDict:
        """Replace the stored object if its resourceVersion is still `expected_version`.

        Writing back an identical object is not a write (no new revision, no watch event),
        as with the API server over etcd.
        """
        objects = self._buckets.get(bucket, {})
        key = _key(obj)
        current = objects.get(key)
        if current is None:
            raise KeyMissing(key)
        if metadata(current)["resourceVersion"] != expected_version:
            raise VersionMismatch(key)
        candidate = copy_json(obj)
        metadata(candidate)["resourceVersion"] = expected_version
        if candidate == current:
            return candidate
        stored = self._stamp(candidate)
        objects[key] = stored
        self._record("MODIFIED", bucket, key[0], stored, current)
        return copy_json(stored)

    def delete(
        self, bucket: str, namespace: str, name: str, expected_version: str | None = None
    ) -> JSONDict:
        objects = self._buckets.get(bucket, {})
        current = objects.get((namespace, name))
        if current is None:
            raise KeyMissing((namespace, name))
        if (
            expected_version is not None
            and metadata(current)["resourceVersion"] != expected_version
        ):
            raise VersionMismatch((namespace, name))
        del objects[(namespace, name)]
        tombstone = self._stamp(current)
        self._record("DELETED", bucket, namespace, tombstone, current)
        return copy_json(tombstone)

    def watch(self, bucket: str, namespace: str | None, since: int | None) -> Watcher:
        """A watcher of one bucket (one namespace or all).

        From `since`, it first yields every logged change after that revision; with `since`
        None, an ADDED for each object now stored (the API server's "start at most recent").
        """
        if since is None:
            items = self._buckets.get(bucket, {})
            pending = [
                Change(int(metadata(obj)["resourceVersion"]), "ADDED", bucket, key[0], obj, None)
                for key, obj in sorted(items.items())
                if namespace is None or key[0] == namespace
            ]
        elif since < self._compacted_through:
            raise TooOld(f"too old resource version: {since} ({self._compacted_through + 1})")
        elif since > self._revision:
            raise TooNew(since)
        else:
            pending = []
            for change in reversed(self._history):
                if change.revision <= since:
                    break
                pending.append(change)
            pending.reverse()
        watcher = Watcher(self, bucket, namespace)
        for change in pending:
            watcher.offer(change)
        if self._closed:
            watcher.offer(None)
        else:
            self._watchers.add(watcher)
        return watcher

    def compact(self) -> int:
        """Forget the whole change log, as etcd compaction does; returns how many were dropped."""
        dropped = len(self._history)
        self._history.clear()
        self._compacted_through = self._revision
        return dropped

    def expire_watches(self, bucket: str | None = None) -> int:
        """Compact, then end every live watch of `bucket` (all when None) with an Expiry, so
        each of their clients gets a 410 and must relist; returns how many were ended."""
        self.compact()
        expired = [w for w in self._watchers if bucket is None or w.bucket == bucket]
        message = f"too old resource version: watch compacted at {self._compacted_through}"
        for watcher in expired:
            watcher.expire(message)
            self._watchers.discard(watcher)
        return len(expired)

    def close(self) -> None:
        """End every watch (each gets a final None) and refuse new ones from now on."""
        self._closed = True
        for watcher in list(self._watchers):
            watcher.offer(None)
        self._watchers.clear()

    def _forget(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def _stamp(self, obj: JSONDict) -> JSONDict:
        self._revision += 1
        stamped = copy_json(obj)
        metadata(stamped)["resourceVersion"] = str(self._revision)
        return stamped

    def _record(
        self,
        change_type: ChangeType,
        bucket: str,
        namespace: str,
        obj: JSONDict,
        previous: JSONDict | None,
    ) -> None:
        change = Change(self._revision, change_type, bucket, namespace, obj, previous)
        if len(self._history) >= self._history_limit:
            self._compacted_through = self._history.popleft().revision
        self._history.append(change)
        for hook in self.on_commit:
            hook(change)
        for watcher in self._watchers:
            watcher.offer(change)


class Watcher:
    """Changes of one bucket in revision order; None marks the end (the store closed), an
    Expiry the end of a watch that must be restarted from a fresh list."""

    def __init__(self, store: Store, bucket: str, namespace: str | None) -> None:
        self._store = store
        self._bucket = bucket
        self._namespace = namespace
        # Unbounded: writes must never wait for a slow watcher; a real API server would drop it.
        self._queue: asyncio.Queue[Change | Expiry | None] = asyncio.Queue()

    @property
    def bucket(self) -> str:
        return self._bucket

    def offer(self, change: Change | None) -> None:
        if change is None or (
            change.bucket == self._bucket
            and (self._namespace is None or change.namespace == self._namespace)
        ):
            self._queue.put_nowait(change)

    def pending(self) -> bool:
        """Whether a change is waiting (a bookmark is only safe when none is)."""
        return not self._queue.empty()

    def expire(self, message: str) -> None:
        """End this watch after what is queued: its client gets a 410 and must relist."""
        self._queue.put_nowait(Expiry(message))

    async def next(self) -> Change | Expiry | None:
        return await self._queue.get()

    def close(self) -> None:
        self._store._forget(self)
