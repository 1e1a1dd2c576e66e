"""`NatsConnection`: what numafit keeps about a NATS connection lives there, not on nats-py's
client; a close the service did not ask for is reported, its own close is not; the hooks run;
and the one private read of nats-py (a micro request's reply subject) still works."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import nats
import pytest
from nats.micro import add_service

from shared.service import natsconn
from shared.testing.nats_server import NatsServer
from tests.integration.processes import free_port

if TYPE_CHECKING:
    from pathlib import Path

    from nats.micro.request import Request


async def test_nothing_of_numafit_is_stored_on_the_client(nats_url: str) -> None:
    """The client `connect` made carries exactly the attributes nats-py gives any client."""
    connection = await natsconn.connect(nats_url, "ours")
    plain = await nats.connect(nats_url, name="plain")

    async def nothing() -> None:
        return None

    try:
        connection.on_error(lambda text: None)
        connection.on_reconnect(nothing)
        assert set(vars(connection.client)) == set(vars(plain))
    finally:
        await connection.close()
        await plain.close()


async def test_a_close_the_server_forces_is_reported_and_our_own_is_not(nats_url: str) -> None:
    reasons: list[str] = []
    closed = asyncio.Event()

    def on_closed(reason: str) -> None:
        reasons.append(reason)
        closed.set()

    ours = await natsconn.connect(nats_url, "closes-itself", on_closed=on_closed)
    await ours.close()
    assert ours.client.is_closed and reasons == []

    forced = await natsconn.connect(nats_url, "closed-by-the-server", on_closed=on_closed)
    # An over-long control line: nats-server ends the connection and nats-py never reconnects.
    await forced.client.publish("a" * 5000, b"")
    async with asyncio.timeout(5):
        await closed.wait()
    assert reasons == ["NATS connection closed: Error('nats: maximum control line exceeded')"]
    assert forced.client.is_closed


async def test_error_hooks_are_told_each_asynchronous_error(tmp_path: Path) -> None:
    config = tmp_path / "permissions.conf"
    config.write_text(
        "authorization { users = [ { user: svc, password: pw, permissions: {"
        ' publish: { deny: ["denied.>"] } } } ] }\n'
    )
    with NatsServer(config=config, jetstream=False) as server:
        connection = await natsconn.connect(server.url.replace("://", "://svc:pw@"), "denied")
        told: list[str] = []
        also: asyncio.Queue[str] = asyncio.Queue()
        connection.on_error(told.append)
        natsconn.on_error(connection.client, also.put_nowait)  # code handed only the client
        try:
            await connection.client.publish("denied.here", b"")
            async with asyncio.timeout(5):
                text = await also.get()
            assert "permissions violation for publish to" in text.lower()
            assert told == [text]
            assert connection.client.is_connected  # a violation leaves the connection up
        finally:
            await connection.close()


async def test_on_error_refuses_a_client_connect_did_not_make(nats_url: str) -> None:
    plain = await nats.connect(nats_url)
    try:
        with pytest.raises(ValueError, match="a connection made by"):
            natsconn.on_error(plain, lambda text: None)
    finally:
        await plain.close()


async def test_reconnect_hooks_given_and_added_run_after_a_reconnect() -> None:
    port = free_port()
    ran: list[str] = []
    both = asyncio.Event()

    async def given() -> None:
        ran.append("given")

    async def added() -> None:
        ran.append("added")
        both.set()

    with NatsServer(port=port, jetstream=False) as server:
        connection = await natsconn.connect(
            server.url, "reconnects", on_reconnect=[given], reconnect_wait=0.05
        )
    try:
        connection.on_reconnect(added)
        assert ran == []
        with NatsServer(port=port, jetstream=False):
            async with asyncio.timeout(10):
                await both.wait()
            assert ran == ["given", "added"]
            assert connection.client.is_connected
    finally:
        await connection.close()


async def test_reply_subject_is_the_inbox_the_requester_named(nats_url: str) -> None:
    """nats.micro keeps the reply subject private (`Request._msg`): natsconn.reply_subject
    reads it there, and this fails should nats-py stop keeping it so."""
    connection = await natsconn.connect(nats_url, "micro")
    nc = connection.client
    seen: asyncio.Queue[str | None] = asyncio.Queue()

    async def handler(request: Request) -> None:
        await seen.put(natsconn.reply_subject(request))

    service = await add_service(nc, name="replyprobe", version="0.0.1")
    try:
        await service.add_endpoint(name="ping", subject="replyprobe.ping", handler=handler)
        await nc.flush()
        inbox = nc.new_inbox()
        await nc.publish("replyprobe.ping", b"", reply=inbox)
        await nc.publish("replyprobe.ping", b"")  # no reply expected
        async with asyncio.timeout(5):
            assert [await seen.get(), await seen.get()] == [inbox, None]
    finally:
        await natsconn.stop_service(nc, service)
        await connection.close()
