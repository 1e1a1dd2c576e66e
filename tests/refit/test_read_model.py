"""svc_refit's read model follows accounting's usage updates, drops deleted nodes, and never
grows for nodes nobody asked about (or that do not exist).

Before the fix it kept every announced node's revision forever (deleted ones included), and a
node's view for every node name a refit named.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import orjson

from shared import subjects
from shared.core.model import DeviceInfo
from shared.messages import (
    NodeStateWire,
    QuotaWire,
    RegisterItem,
    SnapshotReply,
    SnapshotRequest,
    UsageEntry,
)
from shared.service.lifecycle import Deadline
from shared.service.supervisor import Supervisor
from svc_refit.read_model import ReadModel
from tests.builders import container, gpu, node, pod
from tests.integration.harness import Harness, harness, wait_for
from tests.metrics import refit_counter
from tests.refit.helpers import for_create, request_for, worked_objects

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path


async def _publish(h: Harness, name: str, body: dict[str, Any]) -> None:
    assert h.client_nc is not None
    await h.client_nc.publish(subjects.usage(name), orjson.dumps(body))
    await h.client_nc.flush()


async def test_a_deleted_node_is_dropped(nats_url: str, tmp_path: Path) -> None:
    async with harness(nats_url, tmp_path, worked_objects()) as h:
        created = await h.pod("ml", "train")
        assert h.refit is not None
        model = h.refit.read_model
        assert (await h.refit_request(request_for(created, allowedDeviceUUIDs=["GPU-a"])))[
            "code"
        ] == "already_aligned"
        assert model.nodes() == ["node-1"]
        assert h.accounting is not None
        # (Partitioned: the node's revisions count in its partition's epoch, not the run's.)
        node_epoch = h.accounting.ledger.epoch_of("node-1")
        assert node_epoch != h.accounting.ledger.epoch
        for epoch in (h.accounting.ledger.epoch, node_epoch):
            await _publish(
                h,
                "node-1",
                {
                    "epoch": epoch,
                    "node": "node-1",
                    "revision": 99,
                    "devices": {},
                    "deleted": True,
                },
            )
            if epoch != node_epoch:
                # Another ownership's word about the node: it is fetched, not forgotten.
                await wait_for(lambda: model._nodes["node-1"].stale)
                assert model.nodes() == ["node-1"]
        await wait_for(lambda: model.nodes() == [])


async def test_a_node_deleted_in_the_api_leaves_the_read_model(
    nats_url: str, tmp_path: Path
) -> None:
    async with harness(nats_url, tmp_path, worked_objects()) as h:
        created = await h.pod("ml", "train")
        assert h.refit is not None and h.kube is not None
        model = h.refit.read_model
        await h.refit_request(request_for(created, allowedDeviceUUIDs=["GPU-a"]))
        assert model.nodes() == ["node-1"]
        await h.kube.core.delete_node("node-1", _preload_content=False)
        await wait_for(lambda: model.nodes() == [])
        reply = await h.refit_request(request_for(created))
        assert reply["succeeded"] is False
        assert model.nodes() == []


async def test_nodes_nobody_asked_about_are_never_kept(nats_url: str, tmp_path: Path) -> None:
    async with harness(nats_url, tmp_path, worked_objects()) as h:
        created = await h.pod("ml", "train")
        assert h.refit is not None and h.accounting is not None
        model = h.refit.read_model
        epoch = h.accounting.ledger.epoch
        for i in range(50):  # updates for nodes no refit asked about
            await _publish(
                h,
                f"ghost-{i}",
                {"epoch": epoch, "node": f"ghost-{i}", "revision": 1, "devices": {}},
            )
        for i in range(50):  # refits for nodes that do not exist
            name = f"nowhere-{i}"
            reply = await h.refit_request(request_for(created, nodeName=name), node=name)
            assert (reply["succeeded"], reply["code"]) == (False, "node_mismatch"), reply
        assert model.nodes() == []
        assert set(h.accounting.ledger.nodes) == {"node-1"}  # nor does accounting's ledger
        await h.refit_request(request_for(created, allowedDeviceUUIDs=["GPU-a"]))
        assert model.nodes() == ["node-1"]


async def test_the_read_model_is_bounded(nats_url: str, tmp_path: Path) -> None:
    objects: list[tuple[str, dict[str, Any]]] = []
    for i in range(3):
        objects.append(("node", node(f"node-{i}", [gpu(f"GPU-{i}", 0)])))
        objects.append(
            (
                "pod",
                for_create(
                    pod(
                        f"p{i}",
                        containers=[container("app", 1, 1000)],
                        namespace="ml",
                        node_name=f"node-{i}",
                        allocated=f"GPU-{i},NVIDIA,1000,0:;",
                    )
                ),
            )
        )
    async with harness(nats_url, tmp_path, objects) as h:
        assert h.refit is not None
        model = h.refit.read_model
        model.max_nodes = 2
        for i in range(3):
            created = await h.pod("ml", f"p{i}")
            body = request_for(
                created, containerIndex=0, containerName="app", allowedDeviceUUIDs=[f"GPU-{i}"]
            )
            reply = await h.refit_request(body, node=f"node-{i}")
            assert reply["code"] == "already_aligned", reply
            assert len(model) <= 2
        assert model.nodes() == ["node-1", "node-2"]  # the least recently used went first


async def test_usage_updates_keep_the_view_current_without_fetching(
    nats_url: str, tmp_path: Path
) -> None:
    nodes = node("node-1", [gpu("GPU-a", 1), gpu("GPU-b", 0, mem=30000)])
    pods = [
        pod(
            name,
            containers=[container("app", 1, 20000)],
            namespace="ml",
            allocated="GPU-a,NVIDIA,20000,0:;",
        )
        for name in ("first", "second")
    ]
    async with harness(
        nats_url, tmp_path, [("node", nodes)] + [("pod", for_create(p)) for p in pods]
    ) as h:
        assert h.refit is not None
        first, second = await h.pod("ml", "first"), await h.pod("ml", "second")
        reply = await h.refit_request(
            request_for(first, containerIndex=0, containerName="app", allowedDeviceUUIDs=["GPU-b"])
        )
        assert reply["code"] == "moved"
        fetched = refit_counter(h.refit, "snapshots")
        # The second pod's entry came with the first snapshot; the first move's usage came
        # with accounting's update: the refusal needs no fetch at all.
        reply = await h.refit_request(
            request_for(second, containerIndex=0, containerName="app", allowedDeviceUUIDs=["GPU-b"])
        )
        assert reply["code"] == "no_fit" and reply["fitReasons"] == {"CardInsufficientMemory": 1}
        assert refit_counter(h.refit, "snapshots") == fetched


GPU = DeviceInfo("GPU-a", 0, 10, 40000, 100, "NVIDIA A100", 0)
FULL = {"GPU-a": UsageEntry(used=10, usedmem=40000, usedcores=100)}
"""GPU-a taken whole: what the forged update claims."""


class FakeAccounting:
    """Answers every snapshot with node-1 at `revision`, free; `while_asked` runs one callable
    per request after accounting answered, before the answer is read."""

    def __init__(self) -> None:
        self.revision = 3
        self.asked: list[SnapshotRequest] = []
        self.while_asked: list[Callable[[], None]] = []

    async def ask(self, request: Any, reply_type: Any, budget: float | None = None) -> Any:
        assert isinstance(request, SnapshotRequest) and reply_type is SnapshotReply
        self.asked.append(request)
        wire = NodeStateWire(
            node="node-1",
            revision=self.revision,
            devices=(RegisterItem.from_device(GPU),),
            cordoned=(),
            pods=(),
        )
        if self.while_asked:  # accounting has answered; the answer is on its way
            self.while_asked.pop(0)()
        quota = QuotaWire(namespace=request.namespace) if request.namespace else None
        return SnapshotReply(ok=True, code="ok", epoch="e1", nodes=(wire,), pod=None, quota=quota)


@contextlib.asynccontextmanager
async def fake_model() -> AsyncIterator[tuple[ReadModel, FakeAccounting]]:
    """A read model holding node-1 at revision 3 from a first snapshot (no NATS)."""
    accounting = FakeAccounting()
    supervisor = Supervisor("test-refit")
    await supervisor.start()
    model = ReadModel(None, accounting, supervisor)  # type: ignore[arg-type]  # no NATS here
    try:
        await model.refresh_quota("node-1", "ml", Deadline.after_ms(2000), 0.0)
        assert model.revision("node-1") == 3
        yield model, accounting
    finally:
        await supervisor.stop()


def used(model: ReadModel) -> tuple[int | None, int]:
    """(revision, GPU-a's used count) of node-1's entry."""
    entry = model._nodes["node-1"]
    return entry.revision, entry.usage.usage_table()["GPU-a"]["used"]


async def test_a_forged_update_ahead_of_accounting_loses_to_the_next_snapshot() -> None:
    # Before the fix the forged revision+1 outranked every snapshot accounting gave (all at
    # revision 3): the node stayed "full" for every refit until some real change came.
    async with fake_model() as (model, _):
        model.apply_update("e1", "node-1", 4, FULL)
        assert used(model) == (4, 10)
        await model.refresh_quota("node-1", "ml", Deadline.after_ms(2000), 0.0)
        assert used(model) == (3, 0)
        view = await model.view("node-1", "uid-x", "ml", Deadline.after_ms(2000), 0.0)
        assert view.revision == 3 and view.usage is not None
        assert view.usage.usage_table()["GPU-a"]["used"] == 0


async def test_an_update_overtaking_a_snapshot_is_fetched_again_before_a_refit_decides() -> None:
    async with fake_model() as (model, accounting):
        model.mark_stale("node-1")
        # Forged while the snapshot travels: kept at first (it may be a change made after
        # accounting answered), then asked again; accounting, asked after it, still says 3.
        accounting.while_asked.append(lambda: model.apply_update("e1", "node-1", 4, FULL))
        asked = len(accounting.asked)
        view = await model.view("node-1", "uid-x", "ml", Deadline.after_ms(2000), 0.0)
        assert len(accounting.asked) == asked + 2
        assert view.revision == 3 and view.usage is not None
        assert view.usage.usage_table()["GPU-a"]["used"] == 0
        assert used(model) == (3, 0) and not model._nodes["node-1"].stale


async def test_a_real_change_that_overtook_the_snapshot_is_confirmed_and_kept() -> None:
    async with fake_model() as (model, accounting):
        model.mark_stale("node-1")

        def commits() -> None:
            # Accounting committed after answering: its update overtakes the answer (3), and
            # the next snapshot says 4.
            model.apply_update("e1", "node-1", 4, FULL)
            accounting.revision = 4

        accounting.while_asked.append(commits)
        asked = len(accounting.asked)
        view = await model.view("node-1", "uid-x", "ml", Deadline.after_ms(2000), 0.0)
        assert len(accounting.asked) == asked + 2  # kept ahead of 3, then confirmed by 4
        assert view.revision == 4 and not model._nodes["node-1"].stale
