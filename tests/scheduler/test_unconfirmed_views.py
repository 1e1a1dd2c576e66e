"""A view an update left unconfirmed (it may hide a change: a revision gap, unchanged usage)
is good to decide on (accounting re-checks every reserve), never to refuse on: over real
HTTP, with real svc_accounting, nats-server and the API emulator, a (forged) gapped update
saying "GPU full" does not refuse a pod that fits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared import messages, subjects
from shared.messages import UsageEntry, UsageUpdate
from tests.integration.harness import wait_for
from tests.scheduler.stack import pending_pod, stack, two_nodes

if TYPE_CHECKING:
    from pathlib import Path

    from tests.scheduler.stack import Stack


async def publish_gapped(s: Stack, used: int, usedmem: int, usedcores: int) -> int:
    """An update of node-1 two revisions ahead of its view (its revision)."""
    model = s.scheduler.read_model
    real = model.view("node-1")
    assert real is not None
    forged = UsageUpdate(
        epoch=real.epoch,
        node="node-1",
        revision=real.revision + 2,
        devices={"GPU-a": UsageEntry(used=used, usedmem=usedmem, usedcores=usedcores)},
    )
    assert s.h.client_nc is not None
    await s.h.client_nc.publish(subjects.usage("node-1"), messages.encode(forged))
    await s.h.client_nc.flush()
    await wait_for(
        lambda: (v := model.view("node-1")) is not None and v.revision == forged.revision
    )
    return forged.revision


def snapshots(s: Stack) -> float:
    """Snapshots of one node the read model has taken (its own metric)."""
    registry = s.scheduler.metrics.registry
    value = registry.get_sample_value(
        "numafit_scheduler_read_model_snapshots_total", {"scope": "node"}
    )
    return value or 0.0


async def test_a_refusal_fetches_the_unconfirmed_nodes_first(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        warm = await s.h.create("pod", pending_pod("warm", mem=1000, cores=1))
        assert (await s.filter(warm, ["node-1", "node-2"]))["NodeNames"]  # quota now cached
        await publish_gapped(s, used=10, usedmem=40000, usedcores=100)
        assert s.scheduler.read_model.unconfirmed(["node-1"]) == ["node-1"]
        before = snapshots(s)
        # node-1's GPU has room in accounting's ledger; node-2's is too small for the pod.
        created = await s.h.create("pod", pending_pod("train"))
        result = await s.filter(created, ["node-1", "node-2"])
        assert result["NodeNames"] == ["node-1"], result
        assert snapshots(s) > before  # fetched before it could refuse
        assert s.scheduler.read_model.unconfirmed(["node-1"]) == []
