"""A filter that decides what the pod already holds writes nothing.

kube-scheduler puts a pod that was updated while it was being scheduled straight back into its
active queue; a reserve that rewrote `hami.io/vgpu-time` on every retry therefore defeated its
backoff (seen on a real kube-scheduler: hundreds of "already present in the active queue").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core import keys
from tests.scheduler.stack import pending_pod, stack, two_nodes

if TYPE_CHECKING:
    from pathlib import Path


async def test_the_same_decision_again_writes_nothing(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        first = await s.filter(created, ["node-1", "node-2"])
        assert first["NodeNames"] == ["node-1"]
        # The reservation was made a while ago (a rewrite now would carry another vgpu-time).
        assert s.h.kube is not None
        reserved = await s.h.kube.patch_pod_annotations("ml", "train", {keys.VGPU_TIME: "1"}, "")
        version = reserved["metadata"]["resourceVersion"]
        # kube-scheduler retries the pod (e.g. after a failed bind elsewhere): same answer...
        again = await s.filter(reserved, ["node-1", "node-2"])
        assert again["NodeNames"] == ["node-1"]
        after = await s.h.pod("ml", "train")
        # ...and the pod was not written: same resourceVersion, same annotations.
        assert after["metadata"]["resourceVersion"] == version
        assert after["metadata"]["annotations"] == reserved["metadata"]["annotations"]
        assert after["metadata"]["annotations"][keys.VGPU_NODE] == "node-1"


async def test_a_different_decision_is_written(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, two_nodes(small_mem=40000)) as s:
        created = await s.h.create("pod", pending_pod("train"))
        assert (await s.filter(created, ["node-1"]))["NodeNames"] == ["node-1"]
        reserved = await s.h.pod("ml", "train")
        # Only node-2 is a candidate now: the reservation moves, so the pod is written.
        assert (await s.filter(reserved, ["node-2"]))["NodeNames"] == ["node-2"]
        after = await s.h.pod("ml", "train")
        assert after["metadata"]["resourceVersion"] != reserved["metadata"]["resourceVersion"]
        assert after["metadata"]["annotations"][keys.VGPU_NODE] == "node-2"
