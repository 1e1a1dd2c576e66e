"""JetStream calls in tests that run on a cluster still settling: asked again, within a bound,
while a meta or stream leader is being elected (a fresh or just-damaged R3 stream answers
"no responders" or nothing at all for a moment; there is nothing to await instead)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import nats.errors
import nats.js.errors

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.api import KeyValueConfig
    from nats.js.kv import KeyValue


async def create_bucket(
    js: JetStreamContext, config: KeyValueConfig, within: float = 20.0
) -> KeyValue:
    """Create a KV bucket (creating one that exists with the same settings just binds it)."""
    async with asyncio.timeout(within):
        while True:
            try:
                kv: KeyValue = await js.create_key_value(config)
                return kv
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                await asyncio.sleep(0.1)  # no answer: the meta leader is being (re)elected


async def put_within(kv: KeyValue, key: str, value: bytes, within: float = 15.0) -> int:
    """Write `key`; its revision."""
    async with asyncio.timeout(within):
        while True:
            try:
                return await kv.put(key, value)
            except (nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError):
                await asyncio.sleep(0.05)  # the stream has no leader yet: ask again
