"""One NATS connection per service, reconnecting forever and saying so in the logs."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import nats
from nats.aio.client import Client

log = logging.getLogger("numafit.nats")

ReconnectHook = Callable[[], Awaitable[None]]


async def connect(
    url: str,
    name: str,
    *,
    connect_timeout: float = 2.0,
    on_reconnect: list[ReconnectHook] | None = None,
) -> Client:
    """Connect, then reconnect forever; `on_reconnect` hooks (the list may grow after connect)
    run after every reconnect, e.g. to republish state readers may have missed."""
    hooks = on_reconnect if on_reconnect is not None else []

    async def disconnected() -> None:
        log.warning("nats disconnected", extra={"client": name})

    async def reconnected() -> None:
        log.info("nats reconnected", extra={"client": name})
        for hook in list(hooks):
            try:
                await hook()
            except Exception:
                log.exception("reconnect hook failed", extra={"client": name})

    async def error(exc: Exception) -> None:
        log.warning("nats error", extra={"client": name, "error": str(exc)})

    return await nats.connect(
        servers=[u.strip() for u in url.split(",") if u.strip()],
        name=name,
        connect_timeout=connect_timeout,
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
        error_cb=error,
    )
