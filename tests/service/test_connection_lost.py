"""A socket that breaks under a publish is a NATS error, never an `OSError`.

nats-py 2.16 flushes inline when its flusher task has ended, and the `ConnectionResetError`
of that flush escapes `publish` and `request` (seen once in CI: a server of the cluster was
killed while requests flowed, and the requester's loop, which handled every NATS error, died
of it). Callers handle `nats.errors.Error`; the accounting client turns every NATS failure
into `AccountingUnavailable`, so a service falls back instead of failing the call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import nats.errors
import pytest

from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.messages import PendingReply, PendingRequest
from shared.service import natsconn

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from nats.aio.client import Client


@pytest.fixture
async def broken(nats_url: str) -> AsyncIterator[Client]:
    """A real connection whose socket breaks under every publish, as a killed server's did."""
    nc = (await natsconn.connect(nats_url, "broken")).client

    async def reset(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionResetError("Connection lost")

    nc.publish = reset  # type: ignore[method-assign]
    nc.request = reset  # type: ignore[method-assign]
    try:
        yield nc
    finally:
        await nc.close()


async def test_a_request_whose_socket_breaks_raises_a_nats_error(broken: Client) -> None:
    with pytest.raises(nats.errors.Error) as raised:
        await natsconn.request(broken, "lost.test.ping", b"ping", 1.0)
    assert isinstance(raised.value, natsconn.ConnectionLost)
    assert isinstance(raised.value.__cause__, ConnectionResetError)
    assert "connection lost" in str(raised.value)


async def test_a_publish_whose_socket_breaks_raises_a_nats_error(broken: Client) -> None:
    with pytest.raises(natsconn.ConnectionLost):
        await natsconn.publish(broken, "lost.test.event", b"{}")


async def test_the_accounting_client_says_unavailable_when_the_socket_breaks(
    broken: Client,
) -> None:
    client = AccountingClient(broken)
    with pytest.raises(AccountingUnavailable, match="connection lost"):
        await client.ask(PendingRequest(node="node-1"), PendingReply, 1.0)
    # The paged snapshot of every node publishes its request itself.
    with pytest.raises(AccountingUnavailable, match="connection lost"):
        await client.every_node(budget=1.0)


async def test_a_request_nobody_answers_in_time_is_still_a_timeout(nats_url: str) -> None:
    """`TimeoutError` is an `OSError` too: it must stay a timeout, not become a lost socket."""
    requester = (await natsconn.connect(nats_url, "requester")).client
    responder = (await natsconn.connect(nats_url, "responder")).client

    async def silent(msg: Any) -> None:
        return None

    try:
        await responder.subscribe("lost.test.silent", cb=silent)
        await responder.flush()
        with pytest.raises(nats.errors.TimeoutError):
            await natsconn.request(requester, "lost.test.silent", b"", 0.05)
    finally:
        await requester.close()
        await responder.close()
