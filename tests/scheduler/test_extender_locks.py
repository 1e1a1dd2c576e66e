"""The extender's bookkeeping around node locks, without a service: reservations whose bind is
to come make their node busy for other pods (for a while), and waiting binds take turns."""

from __future__ import annotations

import asyncio

from svc_scheduler.extender_locks import BIND_EXPECTED_WITHIN, NodeGates, PendingBinds


def test_a_reservation_makes_its_node_busy_for_others_until_its_bind_ends() -> None:
    binds = PendingBinds()
    binds.add("uid-a", "ml/a", "node-1", now=100.0)
    binds.add("uid-b", "ml/b", "node-1", now=100.0)
    binds.add("uid-c", "ml/c", "node-2", now=100.0)
    assert binds.busy("uid-a", now=101.0) == {
        "node-1": "node is about to allocate pod ml/b",
        "node-2": "node is about to allocate pod ml/c",
    }
    assert binds.queued("uid-z", now=101.0) == {"node-1": 2, "node-2": 1}
    binds.done("uid-b")
    assert binds.busy("uid-a", now=101.0) == {"node-2": "node is about to allocate pod ml/c"}
    # A bind that never came (kube-scheduler gave the pod up) stops counting.
    assert binds.busy("uid-z", now=100.0 + BIND_EXPECTED_WITHIN + 1) == {}
    assert binds.queued("uid-z", now=100.0 + BIND_EXPECTED_WITHIN + 1) == {}


async def test_waiting_binds_take_turns_and_wake_on_the_nodes_change() -> None:
    gates = NodeGates()
    order: list[str] = []
    release = asyncio.Event()

    async def waiter(name: str) -> None:
        async with gates.turn("node-1", 5.0) as mine:
            assert mine
            order.append(name)
            await release.wait()

    first = asyncio.create_task(waiter("first"))
    await asyncio.sleep(0)  # scheduling only: let it take the turn
    second = asyncio.create_task(waiter("second"))
    await asyncio.sleep(0)
    assert order == ["first"] and gates.waiting("node-1") == 2
    release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5.0)
    assert order == ["first", "second"] and gates.waiting("node-1") == 0

    changed = gates.armed("node-1")
    assert gates.armed("node-1") is changed  # one signal per node until it fires
    gates.changed("node-1")
    await asyncio.wait_for(gates.wait(changed, 5.0), 1.0)
    assert changed.is_set()


async def test_a_turn_not_had_in_time_is_given_up() -> None:
    gates = NodeGates()
    held = asyncio.Event()
    done = asyncio.Event()

    async def holder() -> None:
        async with gates.turn("node-1", 5.0):
            held.set()
            await done.wait()

    task = asyncio.create_task(holder())
    await held.wait()
    async with gates.turn("node-1", 0.0) as mine:
        assert not mine
    done.set()
    await task
    assert gates.waiting("node-1") == 0
