"""One NATS connection per service, reconnecting forever and saying so in the logs.

nats-py gives up on a connection the server closed for a protocol error (an over-long control
line, say) and never reconnects: such a connection is closed for good. `on_closed` is called
then, unless the service itself is closing it, so the service can fail readiness and exit.

nats-py's message parser also splits protocol lines on any ASCII whitespace, while nats-server
separates arguments with spaces and tabs only: a subject token holding a form feed or a vertical
tab (which any client may publish to a wildcard subscription) made the parser fail, dropping the
service's connection and the requests in flight. `harden_parser` makes the client split the way
the server does, so such a message arrives whole and is refused like any other bad subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import nats
import nats.errors
from nats.protocol import parser

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.micro.request import Request
    from nats.micro.service import Service

log = logging.getLogger("numafit.nats")


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


def on_error(nc: Client, hook: ErrorHook) -> None:
    """Call `hook` with each asynchronous error of a connection made by `connect`."""
    hooks: list[ErrorHook] | None = getattr(nc, "_numafit_error_hooks", None)
    if hooks is None:
        raise ValueError("on_error needs a connection made by shared.service.natsconn.connect")
    hooks.append(hook)


_SEP = rb"[ \t]+"
_ARG = rb"([^ \t\r\n]+)"
# The group numbering of nats-py's own expressions is kept: subject, sid, (reply + separator),
# reply, [header size,] size.
_REPLY = rb"(" + _ARG + _SEP + rb")?"
_MSG_RE = re.compile(rb"\AMSG" + _SEP + _ARG + _SEP + _ARG + _SEP + _REPLY + rb"(\d+)\r\n")
_HMSG_RE = re.compile(
    rb"\AHMSG" + _SEP + _ARG + _SEP + _ARG + _SEP + _REPLY + rb"(\d+)" + _SEP + rb"(\d+)\r\n"
)


def harden_parser() -> None:
    """Parse MSG/HMSG lines as nats-server writes them (arguments split on space and tab)."""
    parser.MSG_RE = _MSG_RE
    parser.HMSG_RE = _HMSG_RE


harden_parser()

MAX_SAID = 32
"""Distinct errors remembered per outage (beyond them, a new text is said every time)."""
DRAIN_TIMEOUT = 2.0
"""Seconds a drain at shutdown may take (nats-py's default is 30, past any grace period)."""


async def connect(
    url: str,
    name: str,
    *,
    connect_timeout: float = 2.0,
    initial_timeout: float = 30.0,
    on_reconnect: list[ReconnectHook] | None = None,
    inbox_prefix: str = "_INBOX",
    on_closed: Callable[[str], None] | None = None,
    reconnect_wait: float = 0.5,
) -> Client:
    """Connect, then reconnect forever; `on_reconnect` hooks (the list may grow after connect)
    run after every reconnect, e.g. to republish state readers may have missed. `on_closed`
    gets a reason when the connection is closed without the service asking."""
    hooks = on_reconnect if on_reconnect is not None else []
    error_hooks: list[ErrorHook] = []
    client: list[Client] = []
    warned = [False]
    said: set[str] = set()
    """The errors said since the last (re)connect: each is said once per outage."""
    last_error: list[str | None] = [None]
    """The latest error (None: none yet), for the line that gives up."""

    async def disconnected() -> None:
        if client and (client[0].is_closed or client[0].is_draining):
            log.debug("nats connection closed", extra={"client": name})
            return
        log.warning("nats disconnected", extra={"client": name})

    async def closed() -> None:
        nc = client[0] if client else None
        if nc is None or getattr(nc, "_numafit_closing", False):
            return
        last = nc.last_error
        if on_closed is None:
            log.info("nats connection closed", extra={"client": name, "error": repr(last)})
            return
        reason = "NATS connection closed" + (f": {last!r}" if last is not None else "")
        log.error("nats connection closed for good", extra={"client": name, "error": repr(last)})
        on_closed(reason)

    async def reconnected() -> None:
        warned[0] = False
        said.clear()
        log.info("nats reconnected", extra={"client": name})
        for hook in list(hooks):
            try:
                await hook()
            except Exception:
                log.exception("reconnect hook failed", extra={"client": name})

    async def error(exc: Exception) -> None:
        # While the server is down every reconnect attempt fails the same way: say it once
        # per outage, not twice a second.
        # The same goes, while not connected, for any error repeated word for word (a server
        # refusing the credentials answers every attempt with 'Authorization Violation', then
        # a reset). Errors on a live connection (a permissions violation) are always said.
        text = str(exc)[:200] or type(exc).__name__
        last_error[0] = text
        for hook in list(error_hooks):
            try:
                hook(text)
            except Exception:
                log.exception("nats error hook failed", extra={"client": name})
        connecting = not client or not client[0].is_connected
        if (isinstance(exc, (ConnectionRefusedError, OSError)) and warned[0]) or (
            connecting and text in said
        ):
            log.debug("nats error", extra={"client": name, "error": str(exc)})
            return
        warned[0] = warned[0] or isinstance(exc, OSError)
        if connecting and len(said) < MAX_SAID:
            said.add(text)
        log.warning("nats error", extra={"client": name, "error": text})

    servers = [u.strip() for u in url.split(",") if u.strip()]
    try:
        async with asyncio.timeout(initial_timeout):
            nc = await nats.connect(
                servers=servers,
                **credentials_of(servers),
                name=name,
                connect_timeout=connect_timeout,
                inbox_prefix=inbox_prefix,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=reconnect_wait,
                disconnected_cb=disconnected,
                reconnected_cb=reconnected,
                closed_cb=closed,
                error_cb=error,
                drain_timeout=DRAIN_TIMEOUT,
            )
            client.append(nc)
            nc._numafit_error_hooks = error_hooks  # type: ignore[attr-defined]
            warned[0] = False  # connected: the next outage is said afresh
            said.clear()
            # One round trip before the first publish: on a fresh connection nats-server
            # (2.15, measured) can route the first request before it sees subscriptions that
            # other connections flushed a moment ago, answering "no responders" (about 5% of
            # first requests in a tight loop; none after a flush).
            await nc.flush(timeout=max(1, round(connect_timeout)))
            return nc
    except TimeoutError as exc:
        why = f" (last error: {last_error[0]})" if last_error[0] is not None else ""
        raise ConnectionError(
            f"cannot reach NATS at {redacted(url)} within {initial_timeout:g}s{why}"
        ) from exc


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
    nats.micro keeps the message private; the reply subject is what NATS calls `msg.reply`."""
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


async def close(nc: Client) -> None:
    """Drain and close a connection at shutdown, bounded; `on_closed` is not called for it."""
    nc._numafit_closing = True  # type: ignore[attr-defined]
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT + 0.5):
            await nc.drain()
    except Exception:
        with contextlib.suppress(Exception):
            await nc.close()


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
