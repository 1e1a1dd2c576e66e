"""The filter leaves out a node whose kubelet would reject the pod itself (a kubelet before v1.31
and init containers asking for `nvidia.com/gpumem`/`gpucores`), naming the cause, on Nodes the
scheduler watches in the API emulator (the rule: tests/scheduler/test_kubelet_version.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tests.builders import container, gpu, node
from tests.integration.harness import wait_for
from tests.scheduler.stack import Stack, pending_pod, stack

if TYPE_CHECKING:
    from pathlib import Path

REASON = "KubeletRejectsInitContainerResources: kubelet "


def versioned(name: str, version: str, gpu_name: str) -> dict[str, Any]:
    obj = node(name, [gpu(gpu_name, 0)])
    obj["status"] = {"nodeInfo": {"kubeletVersion": version}}
    return obj


async def filtered(s: Stack, created: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The filter's answer once the scheduler's node watch has seen the Nodes (it follows them
    from its start, not before its first filter): the first naming a node's kubelet."""
    answer: dict[str, Any] = {}

    async def refused() -> bool:
        answer.update(await s.filter(created, names))
        return any(r.startswith(REASON) for r in (answer.get("FailedNodes") or {}).values())

    await wait_for(refused)
    return answer


async def test_the_filter_leaves_out_nodes_whose_kubelet_would_reject_the_pod(
    nats_url: str, tmp_path: Path
) -> None:
    objects = [
        ("node", versioned("node-1", "v1.28.7", "GPU-a")),
        ("node", versioned("node-2", "v1.31.2", "GPU-b")),
    ]
    async with stack(nats_url, tmp_path, objects) as s:
        init = [container("prep", 1, 30000, 40)]
        created = await s.h.create("pod", pending_pod("train", init=init))
        result = await filtered(s, created, ["node-1", "node-2"])
        assert result["NodeNames"] == ["node-2"]
        reason = result["FailedNodes"]["node-1"]
        assert reason.startswith(
            "KubeletRejectsInitContainerResources: kubelet v1.28.7 would reject the pod "
            "(OutOfnvidia.com/gpucores): init container prep asks for nvidia.com/gpucores"
        )
        # A pod asking for GPU memory in its app containers only is not affected.
        plain = await s.h.create("pod", pending_pod("plain"))
        assert "node-1" not in (await s.filter(plain, ["node-1"])).get("FailedNodes", {})


async def test_with_only_such_nodes_the_pod_stays_pending_with_the_reason(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, [("node", versioned("node-1", "v1.29.4", "GPU-a"))]) as s:
        init = [container("prep", 1, 30000)]
        created = await s.h.create("pod", pending_pod("train", init=init))
        result = await filtered(s, created, ["node-1"])
        assert result["NodeNames"] == []
        assert "(OutOfnvidia.com/gpumem)" in result["FailedNodes"]["node-1"]
        assert await s.reservation("ml", "train") == {}  # nothing held for it
