"""Nodes that do not exist must not appear in accounting's ledger; deleted ones must leave it.

2,000 `pending` requests on made-up node tokens (a misconfigured or hostile device plugin)
leave the ledger's node count unchanged, as its paged cluster snapshot shows; deleting a Node
(`kubectl delete node`) drops it from the snapshot and from every gauge on /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from prometheus_client import generate_latest

from tests.builders import gpu, node
from tests.chaos.support import ledger_node_names, tally
from tests.integration.harness import Harness, harness, wait_for

if TYPE_CHECKING:
    from pathlib import Path

PHANTOMS = 2000
BATCH = 100


def metrics_text(h: Harness) -> str:
    assert h.accounting is not None
    return generate_latest(h.accounting.metrics.registry).decode()


def labelled(text: str, node_name: str) -> list[str]:
    """Every accounting sample about `node_name`."""
    return [
        line
        for line in text.splitlines()
        if line.startswith("numafit_accounting_") and f'node="{node_name}"' in line
    ]


async def test_phantom_nodes_never_enter_the_ledger_and_deleted_ones_leave_it(
    nats_url: str, tmp_path: Path
) -> None:
    objects = [
        ("node", node("node-1", [gpu("GPU-a", 0)])),
        ("node", node("node-2", [gpu("GPU-z", 0)])),
    ]
    async with harness(nats_url, tmp_path, objects, with_refit=False) as h:
        assert h.kube is not None
        before = await ledger_node_names(h.client)
        assert before == ["node-1", "node-2"]
        assert labelled(metrics_text(h), "node-2"), "node-2 has gauges before it is deleted"

        replies: list[dict[str, Any]] = []
        for batch in range(PHANTOMS // BATCH):
            replies += await asyncio.gather(
                *(
                    h.client.call("pending", f"phantom-{batch}-{i}", {}, budget=10)
                    for i in range(BATCH)
                )
            )
        after_phantoms = await ledger_node_names(h.client)
        phantom_samples = [
            line for line in metrics_text(h).splitlines() if 'node="phantom-' in line
        ]

        core: Any = h.kube.core  # raw response (_preload_content=False), not the model
        response = await core.delete_node("node-2", _preload_content=False)
        assert response.status == 200, await response.read()
        response.release()

        async def node_2_gone() -> bool:
            return "node-2" not in await ledger_node_names(h.client)

        with contextlib.suppress(TimeoutError):  # asserted below, with what the ledger holds
            await wait_for(node_2_gone, within=10)
        after_delete = await ledger_node_names(h.client)
        node_2_samples = labelled(metrics_text(h), "node-2")

    print(f"\n{PHANTOMS} pending on made-up nodes answered {tally(r['code'] for r in replies)}")
    assert all("code" in r for r in replies)
    assert after_phantoms == before, f"{len(after_phantoms)} nodes after {PHANTOMS} phantoms"
    assert not phantom_samples, phantom_samples[:5]
    assert after_delete == ["node-1"], after_delete
    assert not node_2_samples, node_2_samples
