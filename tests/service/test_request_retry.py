"""Requests ride over a short "no responders" gap (a subscription another connection has just
flushed, a replica restarting) but fail fast on a subject nobody serves."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import nats.errors
import pytest

from shared.service import natsconn

if TYPE_CHECKING:
    from nats.aio.msg import Msg


async def test_a_responder_that_appears_after_a_no_responders_answer_is_reached(
    nats_url: str,
) -> None:
    requester = (await natsconn.connect(nats_url, "requester")).client
    responder = (await natsconn.connect(nats_url, "responder")).client
    attempts = 0
    original = requester.request

    async def echo(msg: Msg) -> None:
        await msg.respond(b"pong")

    async def counted(*args: Any, **kwargs: Any) -> Msg:
        nonlocal attempts
        attempts += 1
        try:
            return await original(*args, **kwargs)
        except nats.errors.NoRespondersError:
            if attempts == 1:  # the responder arrives right after the first answer
                await responder.subscribe("retry.test.ping", cb=echo)
                await responder.flush()
            raise

    requester.request = counted  # type: ignore[method-assign]
    try:
        msg = await natsconn.request(requester, "retry.test.ping", b"ping", 2.0, grace=1.0)
        assert msg.data == b"pong" and attempts >= 2
    finally:
        await requester.close()
        await responder.close()


async def test_a_subject_nobody_serves_fails_after_the_grace_not_the_budget(
    nats_url: str,
) -> None:
    requester = (await natsconn.connect(nats_url, "requester")).client
    try:
        with pytest.raises(nats.errors.NoRespondersError):
            async with asyncio.timeout(2.0):  # the budget below is 30 s
                await natsconn.request(requester, "retry.test.nobody", b"", 30.0, grace=0.05)
    finally:
        await requester.close()
