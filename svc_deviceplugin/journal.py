"""Consumptions kubelet was answered for but accounting has not acknowledged yet.

When accounting does not answer an Allocate's `consume` (a takeover under way, a replica
killed, `node_unavailable`) and the plugin knows the pod's entry from GetPreferredAllocation,
kubelet is answered from that entry and the consumption is kept here until accounting
acknowledges it (`svc_deviceplugin.deferred` retries it). The container runs meanwhile, so the
record must survive a plugin restart: the journal is one small JSON file in the plugin's state
directory, rewritten whole on every change (written to a temporary file, fsync'd, renamed over
the old one, the directory fsync'd), so a crash leaves either the old or the new file, never a
torn one. A file that cannot be read is set aside (renamed `*.corrupt`) with a log line and the
plugin starts with an empty journal rather than not at all.

Entries are few: a node admits one pod at a time (accounting's node lock, which an unrecorded
consumption keeps held), so the journal holds at most one pod's containers in practice;
`MAX_ENTRIES` bounds it anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import TYPE_CHECKING, Annotated

import msgspec

from shared.subjects import shown

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

log = logging.getLogger("numafit.deviceplugin")

VERSION = 1
MAX_ENTRIES = 256
"""More unrecorded consumptions than this and Allocate fails rather than grow the file."""
MAX_FILE_BYTES = 4 * 1024 * 1024
"""A journal file larger than this is not one this plugin wrote: set aside, not read."""


class JournalFull(Exception):
    """The journal holds `MAX_ENTRIES` already."""


class DeferredConsume(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One consumption kubelet was answered for: what accounting's `consume` must record."""

    pod_uid: str = msgspec.field(name="podUID")
    pod_namespace: str
    pod_name: str
    container_index: Annotated[int, msgspec.Meta(ge=0)]
    container_name: str
    devices: tuple[str, ...]
    """The GPUs kubelet gave (the consume request's `devices`)."""
    container_devices: str
    """The entry Allocate answered with (HAMi's per-container encoding)."""
    deferred_at: float
    """Unix time of the Allocate."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.pod_uid, self.container_index)


class JournalFile(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    node: str
    entries: tuple[DeferredConsume, ...] = ()


class ConsumeJournal:
    """The records, in the order they were deferred, and the file that keeps them (`path`
    None: in memory only, for embedded plugins such as `numafit simulate`)."""

    def __init__(self, path: Path | None, node: str, *, limit: int = MAX_ENTRIES) -> None:
        self.path = path
        self.node = node
        self.limit = limit
        self._entries: dict[tuple[str, int], DeferredConsume] = {}
        self._lock = asyncio.Lock()
        """One rewrite of the file at a time (each writes the whole current state)."""
        self.unreadable = False
        """The file an earlier run left could not be read (and was set aside)."""

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[DeferredConsume]:
        return iter(list(self._entries.values()))

    def indices(self, pod_uid: str) -> set[int]:
        """Container positions of `pod_uid` whose consumption accounting has not recorded."""
        return {index for uid, index in self._entries if uid == pod_uid}

    def load(self) -> list[DeferredConsume]:
        """Read the file left by an earlier run (a missing one is an empty journal). An
        unreadable one is logged and set aside: the plugin starts empty instead of failing.
        A directory the plugin cannot write is said at once, not at the first deferral."""
        loaded = self._read()
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                usable = os.access(self.path.parent, os.W_OK | os.X_OK)
                problem = "not writable"
            except OSError as exc:
                usable, problem = False, shown(str(exc), 300)
            if not usable:
                log.warning(
                    "consume journal directory not usable: deferred consumptions would be kept "
                    "in memory only",
                    extra={"path": str(self.path.parent), "error": problem},
                )
        return loaded

    def _read(self) -> list[DeferredConsume]:
        if self.path is None:
            return []
        try:
            size = self.path.stat().st_size
            if size > MAX_FILE_BYTES:
                raise ValueError(f"{size} bytes, more than a journal ever holds")
            data = self.path.read_bytes()
            loaded = msgspec.json.decode(data, type=JournalFile)
            if loaded.version != VERSION:
                raise ValueError(f"version {loaded.version}, this plugin writes {VERSION}")
            if loaded.node != self.node:
                raise ValueError(f"written for node {shown(loaded.node)}, not {self.node}")
        except FileNotFoundError:
            return []
        except (OSError, ValueError, msgspec.DecodeError) as exc:
            # msgspec.ValidationError is a DecodeError (and a ValueError).
            self.unreadable = True
            aside = self._set_aside()
            log.error(
                "consume journal unreadable; starting with an empty journal",
                extra={
                    "path": str(self.path),
                    "error": shown(str(exc), 300),
                    "set_aside": str(aside) if aside else None,
                },
            )
            return []
        self._entries = {e.key: e for e in loaded.entries}
        return list(self._entries.values())

    def _set_aside(self) -> Path | None:
        """Keep the unreadable file for a person to look at; it is never read again."""
        if self.path is None:
            return None
        aside = self.path.with_name(f"{self.path.name}.{int(time.time())}.corrupt")
        try:
            self.path.replace(aside)
        except OSError:
            return None
        return aside

    async def add(self, record: DeferredConsume) -> bool:
        """Keep `record` (replacing one for the same container); True when it is on disk.
        `JournalFull` when there is no room: nothing is kept."""
        if record.key not in self._entries and len(self._entries) >= self.limit:
            raise JournalFull(f"{len(self._entries)} consumptions already wait for accounting")
        self._entries[record.key] = record
        return await self._save()

    async def remove(self, key: tuple[str, int]) -> bool:
        """Drop the record of `key` (absent: nothing to do); True when the file says so."""
        if self._entries.pop(key, None) is None:
            return True
        return await self._save()

    async def _save(self) -> bool:
        if self.path is None:
            return False
        async with self._lock:
            body = JournalFile(
                version=VERSION, node=self.node, entries=tuple(self._entries.values())
            )
            data = msgspec.json.encode(body)
            try:
                await asyncio.to_thread(_write_atomically, self.path, data)
            except OSError as exc:
                # The records stay in memory and are retried all the same; only a restart
                # before accounting acknowledges them would lose them.
                log.error(
                    "consume journal not written; its records are kept in memory only",
                    extra={"path": str(self.path), "error": shown(str(exc), 300)},
                )
                return False
        return True


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    # The rename itself is durable only once the directory is.
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
