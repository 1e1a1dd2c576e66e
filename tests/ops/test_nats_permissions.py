"""The sample NATS authorization (deploy/nats/nats-server.conf) on a real nats-server: a GPU
node's credentials reach only its own node's subjects, and replies stay private."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nats.errors
import pytest

from shared import subjects
from shared.nats_server import NatsServer
from shared.service import natsconn

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats-server.conf"
PASSWORDS = {
    f"NUMAFIT_{who}_PASSWORD": f"pw-{who.lower()}"
    for who in ("ACCOUNTING", "REFIT", "SCHEDULER", "NODE_1", "NODE_2")
}


NODE_OPS = ("pending", "consume", "bind-phase", "register", "snapshot")
"""The accounting operations svc_deviceplugin calls (allocator.py and service.py)."""


def url(base: str, user: str) -> str:
    password = PASSWORDS[f"NUMAFIT_{user.upper().replace('-', '_')}_PASSWORD"]
    return base.replace("nats://", f"nats://{user}:{password}@")


async def test_a_node_reaches_only_its_own_subjects() -> None:
    server = NatsServer(config=CONFIG, env=PASSWORDS)
    base = await asyncio.to_thread(server.start)
    clients = []
    try:
        accounting = await natsconn.connect(url(base, "accounting"), "accounting")
        refit = await natsconn.connect(url(base, "refit"), "refit", inbox_prefix="_INBOX_refit")
        node1 = await natsconn.connect(url(base, "node-1"), "node-1", inbox_prefix="_INBOX_node-1")
        clients = [accounting, refit, node1]

        async def answer(msg: Any) -> None:
            await msg.respond(b'{"ok": true}')

        for op in subjects.ACCOUNTING_OPS:
            await accounting.subscribe(subjects.accounting_wildcard(op), queue="q", cb=answer)
        await refit.subscribe(subjects.REFIT_WILDCARD, queue=subjects.REFIT_QUEUE, cb=answer)
        await accounting.flush()
        await refit.flush()

        # Its own node's subjects: answered (responders reply through allow_responses).
        reply = await node1.request(subjects.accounting("pending", "node-1"), b"{}", timeout=2)
        assert reply.data == b'{"ok": true}'
        assert (await node1.request(subjects.refit("node-1"), b"{}", timeout=2)).data

        # Every operation a device plugin uses, for its own node: answered.
        for op in NODE_OPS:
            reply = await node1.request(subjects.accounting(op, "node-1"), b"{}", timeout=2)
            assert reply.data == b'{"ok": true}', op
        # The commits of the scheduler and the refit service, even for its own node: dropped.
        for op in sorted(set(subjects.ACCOUNTING_OPS) - set(NODE_OPS)):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await node1.request(subjects.accounting(op, "node-1"), b"{}", timeout=0.3)
        # ... which the refit service may still send (move), as its credentials allow.
        moved = await refit.request(subjects.accounting("move", "node-1"), b"{}", timeout=2)
        assert moved.data == b'{"ok": true}'

        # Another node's subjects: the server drops the publish, nothing answers.
        for subject in (subjects.accounting("pending", "node-2"), subjects.refit("node-2")):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await node1.request(subject, b"{}", timeout=0.3)
        # Nor may a node listen to the usage stream or other nodes' replies.
        sub = await node1.subscribe(subjects.USAGE_WILDCARD)
        await accounting.publish(subjects.usage("node-2"), b"{}")
        await accounting.flush()
        with pytest.raises(nats.errors.TimeoutError):
            await sub.next_msg(timeout=0.3)
    finally:
        for client in clients:
            await client.close()
        server.stop()
