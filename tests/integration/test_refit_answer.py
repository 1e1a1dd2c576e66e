"""Plain request-reply: the refit answers its requester (the device plugin's inbox) itself,
once accounting has answered the move; accounting answers only the refit. The requester gets
exactly one answer, and a pod asked about again at once is decided on the move that just
landed."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson

from shared import subjects
from shared.core import keys
from shared.messages import MoveRequest
from tests.builders import container, gpu, node, pod, refit_request
from tests.integration.harness import Harness, harness
from tests.integration.test_refit_over_nats import for_create

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def one_pod_objects() -> list[tuple[str, dict[str, Any]]]:
    nodes = node("node-1", [gpu("GPU-a", 0), gpu("GPU-b", 1)])
    target = pod(
        "infer",
        containers=[container("app", 1, 10000, 10)],
        namespace="ml",
        allocated="GPU-a,NVIDIA,10000,10:;",
        annotations={keys.BIND_PHASE: "allocating"},
    )
    return [("node", nodes), ("pod", for_create(target))]


class Inbox:
    """A requester's reply inbox: each request its own reply subject under it, every answer
    kept by the request it answers, in arrival order."""

    def __init__(self, h: Harness) -> None:
        assert h.client_nc is not None
        self.nc = h.client_nc
        self.prefix = self.nc.new_inbox()
        self.answers: list[tuple[int, dict[str, Any]]] = []
        self.asked = 0
        self.arrived = asyncio.Condition()

    async def open(self) -> Inbox:
        async def keep(msg: Any) -> None:
            async with self.arrived:
                self.answers.append((int(msg.subject.rsplit(".", 1)[1]), orjson.loads(msg.data)))
                self.arrived.notify_all()

        await self.nc.subscribe(f"{self.prefix}.*", cb=keep)
        await self.nc.flush()
        return self

    def of(self, request: int) -> list[dict[str, Any]]:
        return [body for number, body in self.answers if number == request]

    async def ask(self, body: dict[str, Any]) -> dict[str, Any]:
        """Send one refit request; its first answer."""
        self.asked += 1
        number = self.asked
        reply = f"{self.prefix}.{number}"
        await self.nc.publish(subjects.refit("node-1"), orjson.dumps(body), reply=reply)
        async with asyncio.timeout(5), self.arrived:
            await self.arrived.wait_for(lambda: bool(self.of(number)))
        return self.of(number)[0]


async def test_each_refit_request_gets_one_answer_from_the_refit(
    nats_url: str, tmp_path: Path
) -> None:
    """Moves and an already aligned pod: one answer each, and accounting never publishes into
    the requester's inbox (nothing of its connection goes there)."""
    async with harness(nats_url, tmp_path, one_pod_objects()) as h:
        created = await h.pod("ml", "infer")
        inbox = await Inbox(h).open()
        assert h.accounting is not None
        sent_by_accounting: list[str] = []
        real_publish = h.accounting.nc.publish

        async def publish(subject: str, *args: Any, **kwargs: Any) -> None:
            sent_by_accounting.append(subject)
            await real_publish(subject, *args, **kwargs)

        h.accounting.nc.publish = publish  # type: ignore[method-assign]
        to_b = {"succeeded": True, "code": "moved", "containerDevices": "GPU-b,NVIDIA,10000,10:"}
        to_a = {"succeeded": True, "code": "moved", "containerDevices": "GPU-a,NVIDIA,10000,10:"}

        assert await inbox.ask(refit_request(created, 0, ["GPU-b"])) == to_b
        assert await inbox.ask(refit_request(created, 0, ["GPU-a"])) == to_a
        aligned = await inbox.ask(refit_request(created, 0, ["GPU-a"]))
        assert aligned["code"] == "already_aligned"
        # A second answer to 1 or 2 would have come on the same connection before answer 3.
        assert inbox.of(1) == [to_b]
        assert inbox.of(2) == [to_a]
        assert inbox.of(3) == [aligned]
        assert not [s for s in sent_by_accounting if s.startswith(inbox.prefix)]
        annotations = (await h.pod("ml", "infer"))["metadata"]["annotations"]
        assert annotations[keys.ALLOCATED] == "GPU-a,NVIDIA,10000,10:;"


async def test_a_pod_asked_about_again_at_once_is_decided_on_the_landed_move(
    nats_url: str, tmp_path: Path
) -> None:
    """The device plugin may ask again before the refit has applied the move accounting
    answered for: each request still decides on the pod as it now is."""
    async with harness(nats_url, tmp_path, one_pod_objects()) as h:
        created = await h.pod("ml", "infer")
        inbox = await Inbox(h).open()
        for target in ["GPU-b", "GPU-a"] * 5:
            answer = await inbox.ask(refit_request(created, 0, [target]))
            assert answer["code"] == "moved", answer
            assert answer["containerDevices"] == f"{target},NVIDIA,10000,10:"
        annotations = (await h.pod("ml", "infer"))["metadata"]["annotations"]
        assert annotations[keys.ALLOCATED] == "GPU-a,NVIDIA,10000,10:;"
        assert annotations[keys.TO_ALLOCATE] == "GPU-a,NVIDIA,10000,10:;"


def _move(created: dict[str, Any], revision: int, **extra: Any) -> dict[str, Any]:
    return {
        "podUID": created["metadata"]["uid"],
        "revision": revision,
        "containerIndex": 0,
        "toAllocate": "GPU-b,NVIDIA,10000,10:;",
        "allocated": "GPU-b,NVIDIA,10000,10:;",
        **extra,
    }


async def test_a_move_naming_an_answer_subject_answers_only_its_caller(
    nats_url: str, tmp_path: Path
) -> None:
    """What an older refit sent (`answerTo`, `answer`) is ignored: the move lands, accounting
    answers its caller alone, and nothing reaches the subject named."""
    async with harness(nats_url, tmp_path, one_pod_objects(), with_refit=False) as h:
        created = await h.pod("ml", "infer")
        inbox = await Inbox(h).open()
        revision = (await h.client.snapshot("node-1"))["nodes"][0]["revision"]
        move = _move(created, revision, answerTo=f"{inbox.prefix}.0", answer={"n": 0})
        reply = await h.client.call("move", "node-1", move)
        assert reply["ok"] is True and "answered" not in reply, reply
        # Anything accounting had published there would have arrived before its reply did
        # (one connection, in order); a snapshot after it makes sure of the order.
        await h.client.snapshot("node-1")
        assert inbox.answers == []
        annotations = (await h.pod("ml", "infer"))["metadata"]["annotations"]
        assert annotations[keys.ALLOCATED] == "GPU-b,NVIDIA,10000,10:;"


async def test_a_request_waits_for_the_pods_move_in_flight(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refit takes a landed move's reply in late (the device plugin, its wait spent, asks
    again): a request for the same pod meanwhile waits for it instead of deciding on the pod as
    it was (which would call the pod still on GPU-a, `already_aligned`, and move nothing)."""
    async with harness(nats_url, tmp_path, one_pod_objects()) as h:
        created = await h.pod("ml", "infer")
        inbox = await Inbox(h).open()
        assert h.refit is not None
        accounting = h.refit.accounting
        real_ask = accounting.ask
        late = asyncio.Event()
        holding = asyncio.Event()
        held: list[bool] = []

        async def slow_ask(request: Any, reply_type: Any, *args: Any, **kwargs: Any) -> Any:
            reply = await real_ask(request, reply_type, *args, **kwargs)
            if isinstance(request, MoveRequest) and not held:
                held.append(True)
                holding.set()
                await late.wait()  # the reply is in, not yet applied: the move is in flight
            return reply

        read_model = h.refit.read_model
        real_wait = read_model.wait_change
        waiting = asyncio.Event()

        async def observed_wait(node: str, within: float) -> bool:
            waiting.set()
            return await real_wait(node, within)

        monkeypatch.setattr(accounting, "ask", slow_ask)
        monkeypatch.setattr(read_model, "wait_change", observed_wait)
        first = asyncio.create_task(inbox.ask(refit_request(created, 0, ["GPU-b"])))
        await asyncio.wait_for(holding.wait(), 5)
        back = asyncio.create_task(inbox.ask(refit_request(created, 0, ["GPU-a"])))
        await asyncio.wait_for(waiting.wait(), 5)
        assert not back.done()
        late.set()
        moved = await first
        assert moved["code"] == "moved", moved
        answer = await back
        assert answer == {
            "succeeded": True,
            "code": "moved",
            "containerDevices": "GPU-a,NVIDIA,10000,10:",
        }
        annotations = (await h.pod("ml", "infer"))["metadata"]["annotations"]
        assert annotations[keys.ALLOCATED] == "GPU-a,NVIDIA,10000,10:;"
