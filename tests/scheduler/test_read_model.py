"""The read model's I/O around `Freshness` (tests/scheduler/test_freshness.py has the rules),
without NATS: usage updates decoded from the wire (a malformed one marks the subject's node
stale), snapshots taken through the typed accounting client, the nodes gauge."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from shared import messages, subjects
from shared.accounting_client import AccountingUnavailable
from shared.core.model import DeviceInfo
from shared.messages import (
    NodeStateWire,
    QuotaWire,
    RegisterItem,
    SnapshotReply,
    SnapshotRequest,
)
from svc_scheduler.read_model import ReadModel

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

GPU = DeviceInfo("GPU-a", 0, 10, 40000, 100, "NVIDIA A100", 0)


def node_wire(revision: int, node: str = "node-1") -> NodeStateWire:
    return NodeStateWire(
        node=node, revision=revision, devices=(RegisterItem.from_device(GPU),), cordoned=(), pods=()
    )


class FakeAccounting:
    """Answers `ask` and `every_node` from canned replies, recording the requests."""

    def __init__(self, epoch: str = "e1", nodes: tuple[NodeStateWire, ...] = ()) -> None:
        self.epoch = epoch
        self.nodes = nodes
        self.asked: list[SnapshotRequest] = []
        self.reply: SnapshotReply | None = None
        self.while_asked: list[Callable[[], None]] = []
        """Run, one per request, while it travels (before its answer is read)."""

    async def every_node(
        self, *, budget: float | None = None, page: int = 200
    ) -> tuple[str, list[NodeStateWire]]:
        return self.epoch, list(self.nodes)

    async def ask(self, request: Any, reply_type: Any, budget: float | None = None) -> Any:
        assert isinstance(request, SnapshotRequest) and reply_type is SnapshotReply
        self.asked.append(request)
        # What travels is what accounting reads: the message round-trips through its JSON.
        assert messages.decode(messages.encode(request), SnapshotRequest) == request
        if self.while_asked:
            self.while_asked.pop(0)()
        if self.reply is not None:
            return self.reply
        wanted = tuple(n for n in self.nodes if n.node == request.node)
        return SnapshotReply(ok=True, code="ok", epoch=self.epoch, nodes=wanted)


@dataclass
class FakeMsg:
    subject: str
    data: bytes


def usage_msg(node: str, body: Any) -> FakeMsg:
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return FakeMsg(f"{subjects.USAGE_PREFIX}.{node.replace('.', '_')}", data)


def table(used: int) -> dict[str, Any]:
    return {"GPU-a": {"used": used, "usedmem": 100 * used, "usedcores": used}}


@contextlib.asynccontextmanager
async def ready_model(*nodes: NodeStateWire) -> AsyncIterator[tuple[ReadModel, FakeAccounting]]:
    """A read model after its first snapshot (its supervisor running, no subscription)."""
    accounting = FakeAccounting(nodes=nodes or (node_wire(3),))
    model = ReadModel(None, accounting)  # type: ignore[arg-type]  # no NATS in these tests
    await model.supervisor.start()
    try:
        await model.refresh_all(1.0)
        assert model.epoch == "e1" and model.is_fresh("node-1")
        yield model, accounting
    finally:
        await model.supervisor.stop()


def gauge(model: ReadModel) -> float | None:
    return model.metrics.registry.get_sample_value("numafit_scheduler_read_model_nodes")


async def test_a_usage_update_from_the_wire_applies_in_place() -> None:
    async with ready_model() as (model, accounting):
        body = {"epoch": "e1", "node": "node-1", "revision": 4, "devices": table(1)}
        await model._on_usage(usage_msg("node-1", body))  # type: ignore[arg-type]
        view = model.view("node-1")
        assert view is not None and view.revision == 4 and view.snapshot is not None
        assert view.snapshot.usage_table()["GPU-a"] == {"used": 1, "usedmem": 100, "usedcores": 1}
        assert (await model.views(["node-1"], 1.0))["node-1"] == view
        assert accounting.asked == []  # no snapshot was needed


@pytest.mark.parametrize(
    "body",
    [
        b"{nope",
        b"[]",
        {"epoch": "e1", "node": "node-1", "revision": 4, "devices": {"GPU-a": {"used": "1"}}},
        {"epoch": "e1", "node": "node-1", "revision": 4, "devices": []},
        {"epoch": "e1", "node": "node-1", "revision": -1, "devices": {}},
        {"epoch": "e1", "node": "node-1", "devices": {}},
    ],
)
async def test_a_malformed_update_marks_the_subjects_node_stale(body: Any) -> None:
    async with ready_model(node_wire(3), node_wire(3, "gpu.node-2")) as (model, accounting):
        await model._on_usage(usage_msg("node-1", body))  # type: ignore[arg-type]
        await model._on_usage(usage_msg("gpu.node-2", body))  # type: ignore[arg-type]
        assert not model.is_fresh("node-1") and not model.is_fresh("gpu.node-2")
        assert model.freshness.to_fetch(["node-1", "gpu.node-2"]) == ["node-1", "gpu.node-2"]
        await model.views(["node-1", "gpu.node-2"], 1.0)
        assert sorted(r.node or "" for r in accounting.asked) == ["gpu.node-2", "node-1"]
        assert model.is_fresh("node-1") and model.is_fresh("gpu.node-2")


async def test_a_malformed_update_on_a_subject_naming_no_node_is_ignored() -> None:
    async with ready_model() as (model, _):
        await model._on_usage(FakeMsg(f"{subjects.USAGE_PREFIX}.Bad_", b"{"))  # type: ignore[arg-type]
        assert model.freshness.to_fetch(["Bad.", "Bad_", "node-1"]) == []


async def test_a_deleted_node_is_dropped_and_counted() -> None:
    async with ready_model() as (model, _):
        assert gauge(model) == 1
        body = {"epoch": "e1", "node": "node-1", "revision": 4, "devices": {}, "deleted": True}
        await model._on_usage(usage_msg("node-1", body))  # type: ignore[arg-type]
        assert model.view("node-1") is None
        assert gauge(model) == 0


async def test_context_asks_for_the_pod_and_quota_and_remembers_the_quota() -> None:
    async with ready_model() as (model, accounting):
        quota = QuotaWire(namespace="ml", used_mem=5)
        accounting.reply = SnapshotReply(
            ok=True, code="ok", epoch="e1", nodes=(node_wire(4),), pod=None, quota=quota
        )
        context = await model.context("node-1", pod_uid="uid-1", namespace="ml", budget=1.0)
        assert accounting.asked == [SnapshotRequest(node="node-1", pod_uid="uid-1", namespace="ml")]
        assert context.tracked is None and context.quota is not None
        assert model.cached_quota("ml") is context.quota  # no limits: trusted a while
        view = model.view("node-1")
        assert view is not None and view.revision == 4
        model.forget_quota("ml")
        assert model.cached_quota("ml") is None


async def test_context_of_a_node_accounting_does_not_know() -> None:
    async with ready_model() as (model, accounting):
        accounting.reply = SnapshotReply(ok=False, code="node_unavailable", error="unknown node")
        assert await model.context("node-1", budget=1.0) == (await model.context("x", budget=1.0))
        assert model.view("node-1") is None and gauge(model) == 0
        accounting.reply = SnapshotReply(ok=False, code="api_error", error="boom")
        with pytest.raises(AccountingUnavailable, match="boom"):
            await model.context("node-1", budget=1.0)


async def test_a_fetch_of_a_node_accounting_no_longer_holds_leaves_it_absent() -> None:
    async with ready_model() as (model, accounting):
        body = {"epoch": "e1", "node": "node-2", "revision": 1, "devices": table(0)}
        await model._on_usage(usage_msg("node-2", body))  # type: ignore[arg-type]
        views = await model.views(["node-2", "made-up"], 1.0)
        assert views == {"node-2": None, "made-up": None}
        assert [r.node for r in accounting.asked] == ["node-2"]  # the made-up name cost nothing
        await model.views(["node-2"], 1.0)
        assert len(accounting.asked) == 1  # absent now, not stale


async def test_a_reconnect_takes_a_full_snapshot() -> None:
    async with ready_model() as (model, accounting):
        accounting.epoch, accounting.nodes = "e2", (node_wire(1), node_wire(1, "node-2"))
        await model.on_reconnect()
        assert model.epoch == "e2" and not model.freshness.needs_full
        assert model.is_fresh("node-2") and gauge(model) == 2


FULL = {"GPU-a": {"used": 10, "usedmem": 40000, "usedcores": 100}}
"""GPU-a taken whole: what the forged update claims."""


def used(model: ReadModel) -> tuple[int, int] | None:
    view = model.view("node-1")
    if view is None or view.snapshot is None:
        return None
    return view.revision, view.snapshot.usage_table()["GPU-a"]["used"]


async def test_a_forged_update_ahead_of_accounting_loses_to_the_next_snapshot() -> None:
    # Before the fix the forged revision+1 outranked every snapshot accounting gave (all at
    # revision 3), and the node stayed "full" until some real change came.
    async with ready_model() as (model, _):
        body = {"epoch": "e1", "node": "node-1", "revision": 4, "devices": FULL}
        await model._on_usage(usage_msg("node-1", body))  # type: ignore[arg-type]
        assert used(model) == (4, 10) and model.is_fresh("node-1")
        await model.context("node-1", namespace="ml", budget=1.0)  # a filter's quota read
        assert used(model) == (3, 0) and model.is_fresh("node-1")
        model.apply_update(messages.decode(msgspec.json.encode(body), messages.UsageUpdate))
        await model.refresh_all(1.0)
        assert used(model) == (3, 0) and model.is_fresh("node-1")


async def test_an_update_overtaking_a_snapshot_is_fetched_again_before_it_is_returned() -> None:
    async with ready_model() as (model, accounting):
        forged = {"epoch": "e1", "node": "node-1", "revision": 4, "devices": FULL}

        def arrives() -> None:
            update = messages.decode(msgspec.json.encode(forged), messages.UsageUpdate)
            model.apply_update(update)

        model.invalidate("node-1")
        accounting.while_asked.append(arrives)  # forged while the snapshot travels
        views = await model.views(["node-1"], 1.0)
        # Kept at first (it may have been a change made after accounting answered), then
        # asked again: accounting, asked after it was seen, still says 3.
        assert [r.node for r in accounting.asked] == ["node-1", "node-1"]
        assert used(model) == (3, 0) and model.is_fresh("node-1")
        assert views["node-1"] == model.view("node-1")
