"""Following one kind of Kubernetes object forever: list, then watch from the list's
resourceVersion, relist after a 410 Gone (or whenever no version is known), and retry every
failed list or watch with the one `Backoff`. Only cancellation ends it.

A kind the API server does not serve (a CRD that is not installed answers 404) is not an error
worth a warning every few seconds: it is logged once and asked for again every
`absent_retry` seconds, so installing the CRD later is picked up without a restart.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, NoReturn

from shared.service import kube_io
from shared.service.backoff import Backoff
from shared.service.logs import log_field

if TYPE_CHECKING:
    import logging
    from collections.abc import AsyncIterator, Awaitable, Callable
    from typing import Any

ABSENT_RETRY = 60.0
"""Seconds between two lists of a kind the API server does not serve."""


async def follow(
    kind: str,
    relist: Callable[[], Awaitable[str]],
    watch: Callable[[str], AsyncIterator[tuple[str, dict[str, Any]]]],
    apply: Callable[[str, dict[str, Any]], Awaitable[None]],
    *,
    log: logging.Logger,
    resource_version: str | None = None,
    backoff: Backoff | None = None,
    absent_retry: float = ABSENT_RETRY,
) -> NoReturn:
    """`relist()` lists and applies the whole state and returns the version to watch from;
    `apply(type, object)` applies one watch event (bookmarks only move the version)."""
    backoff = backoff or Backoff()
    absent_logged = False
    while True:
        try:
            if resource_version is None:
                resource_version = await relist()
                absent_logged = False
            async for event_type, obj in watch(resource_version):
                meta = obj.get("metadata") or {}
                version = meta.get("resourceVersion") if isinstance(meta, dict) else None
                if isinstance(version, str) and version:
                    resource_version = version
                if event_type != "BOOKMARK":
                    await apply(event_type, obj)
                backoff.reset()
        except asyncio.CancelledError:
            raise
        except kube_io.Gone:
            log.info("watch expired; relisting", extra={"kind": kind})
            resource_version = None
        except kube_io.NotFound as exc:
            if not absent_logged:
                log.info(
                    "kind not served; asking again later",
                    extra={"kind": kind, "error": log_field(str(exc)), "delay": absent_retry},
                )
                absent_logged = True
            resource_version = None
            await asyncio.sleep(absent_retry)
        except Exception as exc:
            log.warning(
                "watch or list failed; retrying",
                extra={"kind": kind, "error": log_field(repr(exc)), "delay": backoff.delay},
            )
            await backoff.wait()
