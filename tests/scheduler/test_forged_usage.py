"""A forged (or buggy) usage update must not refuse a fitting pod for longer than the next
snapshot: over real HTTP, with real svc_accounting, nats-server and the API emulator.

Before the fix an update at revision+1 saying "GPU full" outranked every snapshot accounting
gave (all at the real, lower revision), so the scheduler refused a pod that fits for as long as
the node saw no real change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared import messages, subjects
from shared.messages import UsageEntry, UsageUpdate
from tests.integration.harness import wait_for
from tests.scheduler.stack import pending_pod, stack, two_nodes

if TYPE_CHECKING:
    from pathlib import Path


async def test_a_forged_full_update_does_not_refuse_a_fitting_pod(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        model = s.scheduler.read_model
        real = model.view("node-1")
        assert real is not None and real.snapshot is not None
        forged = UsageUpdate(
            epoch=real.epoch,
            node="node-1",
            revision=real.revision + 1,
            devices={"GPU-a": UsageEntry(used=10, usedmem=40000, usedcores=100)},
        )
        assert s.h.client_nc is not None
        await s.h.client_nc.publish(subjects.usage("node-1"), messages.encode(forged))
        await s.h.client_nc.flush()

        def poisoned() -> bool:
            view = model.view("node-1")
            return view is not None and view.revision == forged.revision

        await wait_for(poisoned)
        # node-1's GPU is free in accounting's ledger; node-2's is too small for the pod.
        created = await s.h.create("pod", pending_pod("train"))
        result = await s.filter(created, ["node-1", "node-2"])
        assert result["NodeNames"] == ["node-1"], result
        assert result["Error"] == ""
        # The reservation's commit (its update is waited for: the reserve's revision is
        # expected) is what the view holds next, on top of the real usage.
        await wait_for(lambda: model.is_fresh("node-1"))
        view = model.view("node-1")
        assert view is not None and view.snapshot is not None
        assert view.revision > real.revision
        assert view.snapshot.usage_table()["GPU-a"] == {
            "used": 1,
            "usedmem": 20000,
            "usedcores": 30,
        }
