"""HAMi's node lock in the filter: a node still allocating another pod is left to the last.

Accounting refuses to bind a second pod while one is `allocating` on a node. The filter
prefers a node without the lock whenever one fits (binpack would otherwise send every pod to
the fullest node, to wait there); when only locked nodes fit, it keeps the policy's pick among
them, and the bind waits for the lock (tests/scheduler/test_lock_wait.py): a refusal would park
the pod in kube-scheduler's unschedulable pool, which the lock's release does not empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shared.core import keys
from tests.builders import gpu, node
from tests.scheduler.stack import pending_pod, reserved_pod, stack

if TYPE_CHECKING:
    from pathlib import Path

LOCKED = "node is still allocating pod ml/a"


def fuller_and_idle() -> list[tuple[str, dict[str, Any]]]:
    """node-1 already holds a 20 GB pod (binpack prefers it); node-2 is idle."""
    return [
        ("node", node("node-1", [gpu("GPU-a", 0)])),
        ("node", node("node-2", [gpu("GPU-b", 0)])),
        ("pod", reserved_pod("existing", "node-1", "GPU-a,NVIDIA,20000,30:;")),
    ]


async def test_filter_skips_a_node_locked_by_another_pod(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, fuller_and_idle()) as s:
        a = await s.h.create("pod", pending_pod("a", mem=5000, cores=10))
        assert (await s.filter(a, ["node-1", "node-2"]))["NodeNames"] == ["node-1"]
        await s.bind(a, "node-1")
        assert (await s.annotations("ml", "a"))[keys.BIND_PHASE] == keys.PHASE_ALLOCATING

        # node-1 is fuller, but it is allocating pod a: b goes to the free node.
        b = await s.h.create("pod", pending_pod("b", mem=5000, cores=10))
        result = await s.filter(b, ["node-1", "node-2"])
        assert result["NodeNames"] == ["node-2"], result
        assert result["FailedNodes"] == {"node-1": LOCKED}
        assert (await s.reservation("ml", "b"))[keys.VGPU_NODE] == "node-2"

        # Only the locked node: kept (the bind waits for the lock), nothing refused.
        again = await s.h.pod("ml", "b")
        result = await s.filter(again, ["node-1"])
        assert result["NodeNames"] == ["node-1"], result
        assert result["FailedNodes"] == {}
        assert (await s.reservation("ml", "b"))[keys.VGPU_NODE] == "node-1"

        # The holder itself is not kept off its own node.
        held = await s.h.pod("ml", "a")
        assert (await s.filter(held, ["node-1", "node-2"]))["NodeNames"] == ["node-1"]

        # Once a is admitted (bind-phase success) the lock is gone: binpack fills node-1 again.
        reply = await s.h.client.call(
            "bind-phase", "node-1", {"podUID": a["metadata"]["uid"], "phase": "success"}
        )
        assert reply["ok"], reply
        s.scheduler.read_model.expect("node-1", reply["revision"])
        again = await s.h.pod("ml", "b")
        result = await s.filter(again, ["node-1", "node-2"])
        assert result["NodeNames"] == ["node-1"], result
        assert result["FailedNodes"] == {}


async def test_a_locked_node_keeps_exact_reasons_for_the_others(
    nats_url: str, tmp_path: Path
) -> None:
    objects = [
        *fuller_and_idle(),
        ("node", node("node-3", [gpu("GPU-z", 0, mem=1000)])),
    ]
    async with stack(nats_url, tmp_path, objects) as s:
        a = await s.h.create("pod", pending_pod("a", mem=5000, cores=10))
        assert (await s.filter(a, ["node-1"]))["NodeNames"] == ["node-1"]
        await s.bind(a, "node-1")
        b = await s.h.create("pod", pending_pod("b", mem=5000, cores=10))
        result = await s.filter(b, ["node-1", "node-3"])
        # The locked node is the only one that fits: kept, and node-3 still says why not.
        assert result["NodeNames"] == ["node-1"]
        assert set(result["FailedNodes"]) == {"node-3"}
        assert "CardInsufficientMemory" in result["FailedNodes"]["node-3"]
