"""One NATS connection per service, reconnecting forever and saying so in the logs.

`connect` returns a `NatsConnection`: nats-py's client, and what numafit keeps beside it (the
hooks run after a reconnect or told of an asynchronous error, whether the service itself is
closing it, what was already said during an outage). Whoever connects holds it and closes it;
the services are handed its `client` and use nats-py directly, through the helpers below where
a broken socket must read as a NATS error.

nats-py gives up on a connection the server closed for a protocol error (an over-long control
line, say) and never reconnects: such a connection is closed for good. `on_closed` is called
then, unless the service itself is closing it, so the service can fail readiness and exit.

Every connection parses messages as nats-server writes them (nats_parser_patch.py says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import urllib.parse
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.aio.client import Client

from shared.service import nats_parser_patch

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.micro.request import Request
    from nats.micro.service import Service

log = logging.getLogger("numafit.nats")

nats_parser_patch.apply()


class ConnectionLost(nats.errors.Error):
    """The socket broke under a publish or request (nats-py 2.16 lets the `OSError` of an
    inline flush escape while it has not yet noticed the loss). nats-py reconnects on its own;
    the caller sees a NATS error like any other transport failure, so its handling of
    `nats.errors.Error` covers it."""

    def __str__(self) -> str:
        return "nats: connection lost while sending"


ReconnectHook = Callable[[], Awaitable[None]]
ErrorHook = Callable[[str], None]
"""Told the text of every asynchronous error the server reports (a permissions violation)."""

MAX_SAID = 32
"""Distinct errors remembered per outage (beyond them, a new text is said every time)."""
DRAIN_TIMEOUT = 2.0
"""Seconds a drain at shutdown may take (nats-py's default is 30, past any grace period)."""


class NatsConnection:
    """A nats-py client and numafit's state about it; its methods are the client's callbacks.

    Made by `connect`. The state lives here, not on the client: nats-py's objects carry only
    what nats-py puts on them."""

    def __init__(
        self,
        name: str,
        *,
        on_reconnect: Iterable[ReconnectHook] = (),
        on_closed: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self.client = Client()
        self.closing = False
        """Set by `close`: the connection ends because the service asked."""
        self.last_error: str | None = None
        """The latest error (None: none yet), for the line that gives up connecting."""
        self._on_closed = on_closed
        self._reconnect_hooks = list(on_reconnect)
        self._error_hooks: list[ErrorHook] = []
        self._warned = False
        """A socket error was said during this outage (the next ones are not)."""
        self._said: set[str] = set()
        """The errors said since the last (re)connect: each is said once per outage."""
        self._up = False
        """Connected once: from then on a close the service did not ask for is reported."""

    def on_reconnect(self, hook: ReconnectHook) -> None:
        """Run `hook` after every reconnect, e.g. to republish state readers may have missed."""
        self._reconnect_hooks.append(hook)

    def on_error(self, hook: ErrorHook) -> None:
        """Call `hook` with the text of each asynchronous error of this connection."""
        self._error_hooks.append(hook)

    async def close(self) -> None:
        """Drain and close at shutdown, bounded; `on_closed` is not called for it."""
        self.closing = True
        try:
            async with asyncio.timeout(DRAIN_TIMEOUT + 0.5):
                await self.client.drain()
        except Exception:
            with contextlib.suppress(Exception):
                await self.client.close()

    async def _open(
        self, servers: list[str], connect_timeout: float, inbox_prefix: str, reconnect_wait: float
    ) -> None:
        # Passed as one dict: nats-py annotates its timeouts `int`, yet they are seconds handed
        # to asyncio (fractions work, and the previous untyped `nats.connect` took them so).
        options: dict[str, Any] = {
            "servers": servers,
            **credentials_of(servers),
            "name": self.name,
            "connect_timeout": connect_timeout,
            "inbox_prefix": inbox_prefix,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": reconnect_wait,
            "disconnected_cb": self._disconnected,
            "reconnected_cb": self._reconnected,
            "closed_cb": self._closed,
            "error_cb": self._error,
            "drain_timeout": DRAIN_TIMEOUT,
        }
        await self.client.connect(**options)
        _CONNECTIONS[id(self.client)] = self
        self._connected()
        # One round trip before the first publish: on a fresh connection nats-server
        # (2.15, measured) can route the first request before it sees subscriptions that
        # other connections flushed a moment ago, answering "no responders" (about 5% of
        # first requests in a tight loop; none after a flush).
        await self.client.flush(timeout=max(1, round(connect_timeout)))

    def _connected(self) -> None:
        """Connected, the first time or again: the next outage is said afresh."""
        self._up = True
        self._warned = False
        self._said.clear()

    async def _disconnected(self) -> None:
        if self.client.is_closed or self.client.is_draining:
            log.debug("nats connection closed", extra={"client": self.name})
            return
        log.warning("nats disconnected", extra={"client": self.name})

    async def _closed(self) -> None:
        if self.closing or not self._up:
            return  # the service asked; or never connected, which `connect` itself reports
        last = self.client.last_error
        if self._on_closed is None:
            log.info("nats connection closed", extra={"client": self.name, "error": repr(last)})
            return
        reason = "NATS connection closed" + (f": {last!r}" if last is not None else "")
        log.error(
            "nats connection closed for good", extra={"client": self.name, "error": repr(last)}
        )
        self._on_closed(reason)

    async def _reconnected(self) -> None:
        self._connected()
        log.info("nats reconnected", extra={"client": self.name})
        for hook in list(self._reconnect_hooks):
            try:
                await hook()
            except Exception:
                log.exception("reconnect hook failed", extra={"client": self.name})

    async def _error(self, exc: Exception) -> None:
        # While the server is down every reconnect attempt fails the same way: say it once
        # per outage, not twice a second.
        # The same goes, while not connected, for any error repeated word for word (a server
        # refusing the credentials answers every attempt with 'Authorization Violation', then
        # a reset). Errors on a live connection (a permissions violation) are always said.
        text = str(exc)[:200] or type(exc).__name__
        self.last_error = text
        for hook in list(self._error_hooks):
            try:
                hook(text)
            except Exception:
                log.exception("nats error hook failed", extra={"client": self.name})
        connecting = not self.client.is_connected
        if (isinstance(exc, (ConnectionRefusedError, OSError)) and self._warned) or (
            connecting and text in self._said
        ):
            log.debug("nats error", extra={"client": self.name, "error": str(exc)})
            return
        self._warned = self._warned or isinstance(exc, OSError)
        if connecting and len(self._said) < MAX_SAID:
            self._said.add(text)
        log.warning("nats error", extra={"client": self.name, "error": text})


_CONNECTIONS: weakref.WeakValueDictionary[int, NatsConnection] = weakref.WeakValueDictionary()
"""Every live connection `connect` made, by the id of its client: for code handed only the
client (`on_error`). Weak, so the table keeps nothing alive (the weakref documentation's way
of associating data with objects owned elsewhere without adding attributes to them)."""


def on_error(nc: Client, hook: ErrorHook) -> None:
    """Call `hook` with each asynchronous error of a client `connect` made (for code handed
    only the client; whoever holds the `NatsConnection` calls its `on_error`)."""
    connection = _CONNECTIONS.get(id(nc))
    if connection is None or connection.client is not nc:
        raise ValueError("on_error needs a connection made by shared.service.natsconn.connect")
    connection.on_error(hook)


async def connect(
    url: str,
    name: str,
    *,
    connect_timeout: float = 2.0,
    initial_timeout: float = 30.0,
    on_reconnect: Iterable[ReconnectHook] = (),
    inbox_prefix: str = "_INBOX",
    on_closed: Callable[[str], None] | None = None,
    reconnect_wait: float = 0.5,
) -> NatsConnection:
    """Connect, then reconnect forever; the `on_reconnect` hooks (and those added later with
    `NatsConnection.on_reconnect`) run after every reconnect. `on_closed` gets a reason when
    the connection is closed without the service asking."""
    connection = NatsConnection(name, on_reconnect=on_reconnect, on_closed=on_closed)
    servers = [u.strip() for u in url.split(",") if u.strip()]
    try:
        async with asyncio.timeout(initial_timeout):
            await connection._open(servers, connect_timeout, inbox_prefix, reconnect_wait)
    except TimeoutError as exc:
        last = connection.last_error
        why = f" (last error: {last})" if last is not None else ""
        raise ConnectionError(
            f"cannot reach NATS at {redacted(url)} within {initial_timeout:g}s{why}"
        ) from exc
    return connection


def redacted(url: str) -> str:
    """NATS server URL(s) as logs may show them: the password of `user:password@` and a token
    (`token@`) are hidden."""

    def hide(match: re.Match[str]) -> str:
        user, colon, _ = match.group(1).partition(":")
        return f"//{user}:***@" if colon else "//***@"

    return re.sub(r"//([^/@,]*)@", hide, url)


def credentials_of(servers: list[str]) -> dict[str, str]:
    """The credentials of the first URL that carries some, as connection options: nats-py
    uses a URL's own credentials for that server only, and the cluster members it discovers
    (to fail over to) would otherwise get none ("Authorization Violation")."""
    for server in servers:
        parts = urllib.parse.urlsplit(server if "://" in server else f"nats://{server}")
        if parts.username and parts.password is not None:
            return {
                "user": urllib.parse.unquote(parts.username),
                "password": urllib.parse.unquote(parts.password),
            }
        if parts.username:
            return {"token": urllib.parse.unquote(parts.username)}
    return {}


def reply_subject(request: Request) -> str | None:
    """The reply subject of a `nats.micro` request (None when the sender expects no reply).

    nats.micro offers no public way to read it: its `Request` keeps the message in `_msg`
    (nats-py 2.16). This is the one place numafit reads it;
    tests/service/test_natsconn_connection.py fails should nats.micro stop keeping it there."""
    reply: str = request._msg.reply
    return reply or None


NO_RESPONDERS_GRACE = 0.1
"""Seconds a request keeps retrying a "no responders" answer before taking it as final."""


async def request(
    nc: Client, subject: str, data: bytes, budget: float, *, grace: float = NO_RESPONDERS_GRACE
) -> Msg:
    """`nc.request` within `budget` seconds, retrying "no responders" for at most `grace`.

    nats-server (2.15, measured) can answer "no responders" to a request sent just after a
    subscriber on another connection flushed its subscription (a few percent of such requests
    under load), and a replica restarting leaves the same short gap. A short, bounded retry
    rides over both; a subject nobody serves still fails fast (after `grace`), so a fallback
    is not delayed by the whole budget. A socket that breaks under the request is
    `ConnectionLost`, a NATS error like the others.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget
    retry_until = loop.time() + min(grace, budget)
    delay = 0.005
    while True:
        try:
            with _sending():
                return await nc.request(subject, data, timeout=max(deadline - loop.time(), 0.001))
        except nats.errors.NoRespondersError:
            if loop.time() + delay >= retry_until:
                raise
            await asyncio.sleep(delay)
            delay *= 2


@contextlib.contextmanager
def _sending() -> Iterator[None]:
    """A socket that breaks under what is sent here is `ConnectionLost`; a timeout stays one
    (`TimeoutError`, nats' included, is an `OSError` too)."""
    try:
        yield
    except TimeoutError:
        raise
    except OSError as exc:
        raise ConnectionLost from exc


async def publish(nc: Client, subject: str, data: bytes, *, reply: str = "") -> None:
    """`nc.publish`, its broken socket a `ConnectionLost` (a NATS error) like `request`'s."""
    with _sending():
        await nc.publish(subject, data, reply=reply)


async def respond(request: Request, data: bytes) -> None:
    """`nats.micro`'s `respond`, its broken socket a `ConnectionLost` like `publish`'s."""
    with _sending():
        await request.respond(data)


async def stop_service(nc: Client, service: Service | None) -> None:
    """Stop a `nats.micro` service; on a connection already closed (the reason the service is
    stopping) there is nothing to unsubscribe, and in-flight requests must still finish."""
    if service is None:
        return
    try:
        await service.stop()
        # The server must have dropped the endpoints before we return: otherwise it may still
        # pick this replica from the queue group for a new request.
        await nc.flush(timeout=1)
    except Exception as exc:
        log.info("service endpoints not stopped cleanly", extra={"error": repr(exc)[:200]})


async def peers(nc: Client, service: str, wait: float) -> list[dict[str, Any]]:
    """The INFO of a running instance of the NATS micro service `service` (the first that
    answers `$SRV.INFO.<service>` within `wait` seconds), or none."""
    try:
        msg = await nc.request(f"$SRV.INFO.{service}", b"", timeout=wait)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError, TimeoutError):
        return []
    try:
        info = json.loads(msg.data)
    except ValueError:
        return []
    return [info] if isinstance(info, dict) else []
