"""Serving a watch: a store Watcher turned into the API server's newline-delimited event stream.

Each line is {"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}. Selectors are
applied to both sides of every change, as the watch cache does: an object that starts matching
arrives as ADDED, and one that stops matching leaves as DELETED (its last matching state at the
change's revision), so a selective watcher's view stays consistent with a selective list.
A watch ends at timeoutSeconds (the client then re-watches from the last revision it saw), when
the client goes away, when the emulator stops, or with an ERROR event carrying a 410 Status when
the store expired it (the client must then list again).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from . import errors
from .objects import JSONDict, metadata
from .registry import matches
from .store import Change, Expiry, Store, Watcher

if TYPE_CHECKING:
    from collections.abc import Callable

    from .resources import ResourceKind
    from .selectors import FieldSelector, LabelSelector


@dataclass(frozen=True, slots=True)
class WatchOptions:
    labels: LabelSelector
    fields: FieldSelector
    timeout_s: float | None
    """Server-side end of the watch (timeoutSeconds); None to run until the client leaves."""
    bookmarks: bool
    bookmark_interval_s: float
    """How long a quiet watch waits before sending a BOOKMARK (when bookmarks are allowed)."""
    render: Callable[[JSONDict], JSONDict] | None = None
    """What each event carries instead of the object (a Table row for kubectl get -w)."""


def _shown(kind: ResourceKind, stored: JSONDict, options: WatchOptions) -> JSONDict:
    obj = kind.from_storage(stored)
    return obj if options.render is None else options.render(obj)


def event_line(event_type: str, obj: JSONDict) -> bytes:
    return orjson.dumps({"type": event_type, "object": obj}) + b"\n"


def visible_event(kind: ResourceKind, change: Change, options: WatchOptions) -> bytes | None:
    """The line a watcher with these selectors sees for `change`, or None if it sees nothing."""
    now_matches = matches(kind, change.object, options.labels, options.fields)
    if change.type != "MODIFIED":
        return (
            event_line(change.type, _shown(kind, change.object, options)) if now_matches else None
        )
    assert change.previous is not None
    matched_before = matches(kind, change.previous, options.labels, options.fields)
    if now_matches:
        return event_line(
            "MODIFIED" if matched_before else "ADDED", _shown(kind, change.object, options)
        )
    if matched_before:
        # Left the selection: DELETED, with the state it was last seen in, at this revision.
        last_seen = dict(change.previous)
        last_seen["metadata"] = {
            **metadata(change.previous),
            "resourceVersion": str(change.revision),
        }
        return event_line("DELETED", _shown(kind, last_seen, options))
    return None


async def start_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    return response


async def serve(
    response: web.StreamResponse,
    kind: ResourceKind,
    store: Store,
    watcher: Watcher,
    options: WatchOptions,
) -> None:
    """Stream `watcher`'s changes into an already prepared response until the watch ends."""
    loop = asyncio.get_running_loop()
    deadline = None if options.timeout_s is None else loop.time() + options.timeout_s
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                while True:
                    change = await _next_or_bookmark(response, kind, store, watcher, options)
                    if change is None:
                        break  # the emulator is stopping
                    if isinstance(change, Expiry):
                        expired = errors.expired(change.message).status
                        await response.write(event_line("ERROR", expired))
                        break
                    line = visible_event(kind, change, options)
                    if line is not None:
                        await response.write(line)
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away; nothing left to tell it
    finally:
        watcher.close()


async def _next_or_bookmark(
    response: web.StreamResponse,
    kind: ResourceKind,
    store: Store,
    watcher: Watcher,
    options: WatchOptions,
) -> Change | Expiry | None:
    if not options.bookmarks:
        return await watcher.next()
    while True:
        try:
            async with asyncio.timeout(options.bookmark_interval_s):
                return await watcher.next()
        except TimeoutError:
            if watcher.pending():
                continue
            # Nothing is queued, so every change up to the store's revision has been delivered
            # or filtered out: that revision is a safe place for the client to resume from.
            bookmark = {
                "kind": kind.kind,
                "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(store.revision)},
            }
            await response.write(event_line("BOOKMARK", bookmark))
