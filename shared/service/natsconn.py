"""One NATS connection per service, reconnecting forever and saying so in the logs."""

from __future__ import annotations

import asyncio
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
    initial_timeout: float = 30.0,
    on_reconnect: list[ReconnectHook] | None = None,
    inbox_prefix: str = "_INBOX",
) -> Client:
    """Connect, then reconnect forever; `on_reconnect` hooks (the list may grow after connect)
    run after every reconnect, e.g. to republish state readers may have missed."""
    hooks = on_reconnect if on_reconnect is not None else []
    client: list[Client] = []

    async def disconnected() -> None:
        if client and (client[0].is_closed or client[0].is_draining):
            log.debug("nats connection closed", extra={"client": name})
            return
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

    servers = [u.strip() for u in url.split(",") if u.strip()]
    try:
        async with asyncio.timeout(initial_timeout):
            nc = await _connect(
                servers, name, connect_timeout, inbox_prefix, disconnected, reconnected, error
            )
            client.append(nc)
            return nc
    except TimeoutError as exc:
        raise ConnectionError(f"cannot reach NATS at {url} within {initial_timeout:g}s") from exc


async def _connect(
    servers: list[str],
    name: str,
    connect_timeout: float,
    inbox_prefix: str,
    disconnected: Callable[[], Awaitable[None]],
    reconnected: Callable[[], Awaitable[None]],
    error: Callable[[Exception], Awaitable[None]],
) -> Client:
    return await nats.connect(
        servers=servers,
        name=name,
        connect_timeout=connect_timeout,
        inbox_prefix=inbox_prefix,
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
        error_cb=error,
    )
