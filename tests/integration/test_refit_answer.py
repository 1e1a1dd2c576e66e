"""A landed move is answered by accounting itself, straight to the refit's requester (the
device plugin's inbox), one hop sooner than through the refit; everything else the refit
answers. The requester gets exactly one answer either way, and a pod asked about again at once
is decided on the move that just landed."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from shared import subjects
from shared.core import keys
from shared.messages import MoveRequest
from tests.builders import container, gpu, node, pod, refit_request
from tests.integration.harness import Harness, harness, wait_for
from tests.integration.test_refit_over_nats import for_create

if TYPE_CHECKING:
    from pathlib import Path


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


async def test_accounting_answers_alone_once_the_broker_took_its_answer(
    nats_url: str, tmp_path: Path
) -> None:
    """The first landed move answered to an inbox prefix is answered twice (accounting's answer
    first, then the refit's copy, the same bytes) while accounting learns that the broker takes
    its answers there; after that accounting's answer is the only one."""
    async with harness(nats_url, tmp_path, one_pod_objects()) as h:
        created = await h.pod("ml", "infer")
        inbox = await Inbox(h).open()
        to_b = {"succeeded": True, "code": "moved", "containerDevices": "GPU-b,NVIDIA,10000,10:"}
        to_a = {"succeeded": True, "code": "moved", "containerDevices": "GPU-a,NVIDIA,10000,10:"}

        assert await inbox.ask(refit_request(created, 0, ["GPU-b"])) == to_b
        assert h.accounting is not None
        relay = h.accounting.relay
        await wait_for(lambda: relay.allowed(f"{inbox.prefix}.x") is True)
        assert await inbox.ask(refit_request(created, 0, ["GPU-a"])) == to_a
        # The refit answers the next one itself, on the connection its copies come by: any
        # copy of the earlier answers is in by the time this answer is.
        aligned = await inbox.ask(refit_request(created, 0, ["GPU-a"]))
        assert aligned["code"] == "already_aligned"
        assert inbox.of(1) == [to_b, to_b]
        assert inbox.of(2) == [to_a]
        assert inbox.of(3) == [aligned]
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


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"answerTo": "numafit.refit.v1.node-1", "answer": {"a": 1}}, "not a reply subject"),
        ({"answerTo": "_INBOX.*", "answer": {"a": 1}}, "not a reply subject"),
        ({"answerTo": "$SYS.REQ.SERVER.PING", "answer": {"a": 1}}, "not a reply subject"),
        ({"answerTo": "_INBOX.a b", "answer": {"a": 1}}, "not a reply subject"),
        ({"answerTo": "_INBOX." + "x" * 300, "answer": {"a": 1}}, "not a reply subject"),
        ({"answerTo": "_INBOX.abc"}, "come together"),
        ({"answer": {"a": 1}}, "come together"),
        ({"answerTo": "_INBOX.abc", "answer": [1]}, "JSON object"),
        ({"answerTo": "_INBOX.abc", "answer": {"a": "x" * 9000}}, "exceeds"),
    ],
)
async def test_a_move_with_a_bad_answer_is_refused_and_changes_nothing(
    nats_url: str, tmp_path: Path, extra: dict[str, Any], why: str
) -> None:
    async with harness(nats_url, tmp_path, one_pod_objects(), with_refit=False) as h:
        created = await h.pod("ml", "infer")
        before = (await h.client.snapshot("node-1"))["nodes"][0]
        reply = await h.client.call("move", "node-1", _move(created, before["revision"], **extra))
        assert reply["code"] == "invalid_request" and why in reply["error"], reply
        after = (await h.client.snapshot("node-1"))["nodes"][0]
        assert after["revision"] == before["revision"]
        assert (await h.pod("ml", "infer"))["metadata"] == created["metadata"]


async def test_accounting_publishes_the_answer_before_its_reply(
    nats_url: str, tmp_path: Path
) -> None:
    async with harness(nats_url, tmp_path, one_pod_objects(), with_refit=False) as h:
        created = await h.pod("ml", "infer")
        inbox = await Inbox(h).open()
        revision = (await h.client.snapshot("node-1"))["nodes"][0]["revision"]
        first = _move(created, revision, answerTo=f"{inbox.prefix}.0", answer={"n": 0})
        reply = await h.client.call("move", "node-1", first)
        # Published before the reply, on the same connection: here before the reply returned.
        # Not yet known to reach this prefix: the reply does not say `answered`.
        assert reply["ok"] is True and "answered" not in reply
        assert inbox.answers == [(0, {"n": 0})]
        assert h.accounting is not None
        relay = h.accounting.relay
        await wait_for(lambda: relay.allowed(f"{inbox.prefix}.0") is True)
        annotations = created["metadata"]["annotations"]
        back = dict(
            _move(created, reply["revision"], answerTo=f"{inbox.prefix}.1", answer={"n": 1}),
            toAllocate=annotations[keys.TO_ALLOCATE],
            allocated=annotations[keys.ALLOCATED],
        )
        again = await h.client.call("move", "node-1", back)
        assert again["ok"] is True and again["answered"] is True
        assert inbox.answers == [(0, {"n": 0}), (1, {"n": 1})]
        plain = await h.client.call("move", "node-1", _move(created, again["revision"]))
        assert plain["ok"] is True and "answered" not in plain
        assert inbox.answers == [(0, {"n": 0}), (1, {"n": 1})]


async def test_a_request_waits_for_the_pods_move_in_flight(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refit takes a landed move's reply in late (accounting answered the device plugin
    first): a request for the same pod meanwhile waits for it instead of deciding on the pod as
    it was (which would call the pod still on GPU-a, `already_aligned`, and move nothing)."""
    async with harness(nats_url, tmp_path, one_pod_objects()) as h:
        created = await h.pod("ml", "infer")
        inbox = await Inbox(h).open()
        assert h.refit is not None
        accounting = h.refit.accounting
        real_ask = accounting.ask
        late = asyncio.Event()
        held: list[bool] = []

        async def slow_ask(request: Any, reply_type: Any, *args: Any, **kwargs: Any) -> Any:
            reply = await real_ask(request, reply_type, *args, **kwargs)
            if isinstance(request, MoveRequest) and not held:
                held.append(True)
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
        first = await inbox.ask(refit_request(created, 0, ["GPU-b"]))
        assert first["code"] == "moved", first
        back = asyncio.create_task(inbox.ask(refit_request(created, 0, ["GPU-a"])))
        await asyncio.wait_for(waiting.wait(), 5)
        assert not back.done()
        late.set()
        answer = await back
        assert answer == {
            "succeeded": True,
            "code": "moved",
            "containerDevices": "GPU-a,NVIDIA,10000,10:",
        }
        annotations = (await h.pod("ml", "infer"))["metadata"]["annotations"]
        assert annotations[keys.ALLOCATED] == "GPU-a,NVIDIA,10000,10:;"


async def test_a_landed_move_whose_answer_cannot_be_sent_still_says_it_landed(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The socket breaking under accounting's answer must not turn a landed move into an
    internal error: the reply says the move landed, not `answered`, so the refit answers."""
    async with harness(nats_url, tmp_path, one_pod_objects(), with_refit=False) as h:
        created = await h.pod("ml", "infer")
        inbox = await Inbox(h).open()
        assert h.accounting is not None
        nc = h.accounting.nc
        real_publish = nc.publish

        async def breaks_on_answers(subject: str, *args: Any, **kwargs: Any) -> None:
            if subject.startswith(inbox.prefix):
                raise ConnectionResetError("Connection lost")
            await real_publish(subject, *args, **kwargs)

        monkeypatch.setattr(nc, "publish", breaks_on_answers)
        revision = (await h.client.snapshot("node-1"))["nodes"][0]["revision"]
        move = _move(created, revision, answerTo=f"{inbox.prefix}.0", answer={"n": 0})
        reply = await h.client.call("move", "node-1", move)
        assert reply["ok"] is True and reply["revision"] > revision, reply
        assert "answered" not in reply
        annotations = (await h.pod("ml", "infer"))["metadata"]["annotations"]
        assert annotations[keys.ALLOCATED] == "GPU-b,NVIDIA,10000,10:;"
        assert inbox.answers == []
