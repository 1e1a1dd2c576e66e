"""Names that are not Kubernetes names never become NATS subjects.

Before the fix, `/filter` with a 5000-character node name made the scheduler publish a subject
longer than nats-server's control-line limit: the server closed the connection, nats-py never
reconnected, and every later filter answered `accounting unavailable`. Names with a space or a
tab raised `BadSubjectError` (HTTP 500), and a 1 MiB pod name `MaxPayloadError`. Each is now
answered with the verb's own error, and the scheduler keeps its connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from shared.core import keys
from tests.scheduler.stack import Stack, pending_pod, stack, two_nodes

if TYPE_CHECKING:
    from pathlib import Path


async def still_serving(s: Stack) -> None:
    """The NATS connection survived: a real filter still reserves through accounting."""
    assert s.scheduler.read_model.nc.is_connected
    name = f"probe-{len(await s.h.kube.list_pods() if s.h.kube else [])}"
    created = await s.h.create("pod", pending_pod(name, mem=1000))
    result = await s.filter(created, ["node-1"])
    assert result["NodeNames"] == ["node-1"], result
    assert (await s.reservation("ml", name))[keys.VGPU_NODE] == "node-1"


@pytest.mark.parametrize(
    "names",
    [["a" * 5000], ["node 1"], ["node-1", "bad\tname"], ["*"], ["node-1.>"], [""], ["A" * 254]],
)
async def test_filter_refuses_names_that_are_not_node_names(
    nats_url: str, tmp_path: Path, names: list[str]
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        status, body = await s.post("/filter", {"Pod": created, "NodeNames": names})
        assert status == 200, body
        assert "NodeNames" in body["Error"] and body["NodeNames"] == []
        assert len(body["Error"]) < 400  # the 5000 characters are not echoed back
        assert keys.VGPU_NODE not in await s.reservation("ml", "train")
        await still_serving(s)


async def test_prioritize_scores_bad_names_zero_without_asking(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        long_name = "a" * 5000
        status, body = await s.post(
            "/prioritize", {"Pod": created, "NodeNames": [long_name, "node 1", "node-1"]}
        )
        assert status == 200, body
        scores: dict[str, Any] = {entry["Host"]: entry["Score"] for entry in body}
        assert scores[long_name] == 0 and scores["node 1"] == 0
        assert scores["node-1"] > 0
        await still_serving(s)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("Node", "c" * 5000),
        ("Node", "\t"),
        ("Node", "node-1.*"),
        ("PodName", "p" * (1 << 20)),
        ("PodNamespace", "ml ns"),
        ("PodUID", "u" * (1 << 20)),
    ],
)
async def test_bind_refuses_bad_names_with_its_error_field(
    nats_url: str, tmp_path: Path, field: str, value: str
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        args = {
            "PodName": "train",
            "PodNamespace": "ml",
            "PodUID": created["metadata"]["uid"],
            "Node": "node-1",
        }
        args[field] = value
        status, body = await s.post("/bind", args)
        assert status == 200, body
        assert body["Error"] and len(body["Error"]) < 400
        pod = await s.h.pod("ml", "train")
        assert not (pod.get("spec") or {}).get("nodeName")
        await still_serving(s)


async def test_filter_refuses_a_pod_whose_names_cannot_travel(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        forged = {**created, "metadata": {**created["metadata"], "name": "n" * (1 << 20)}}
        status, body = await s.post("/filter", {"Pod": forged, "NodeNames": ["node-1"]})
        assert status == 200
        assert "pod name" in body["Error"] and body["NodeNames"] == []
        await still_serving(s)


async def test_made_up_node_names_cost_no_snapshots(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        registry = s.scheduler.metrics.registry

        def snapshots() -> float:
            return sum(
                registry.get_sample_value(
                    "numafit_scheduler_read_model_snapshots_total", {"scope": scope}
                )
                or 0.0
                for scope in ("all", "node")
            )

        warm = await s.h.create("pod", pending_pod("warm", mem=1000))
        assert (await s.filter(warm, ["node-1"]))["NodeNames"] == ["node-1"]  # quota cached
        created = await s.h.create("pod", pending_pod("train", mem=1000))
        before = snapshots()
        names = [f"made-up-{i}" for i in range(2000)]
        result = await s.filter(created, [*names, "node-1"])
        assert result["NodeNames"] == ["node-1"]
        assert set(result["FailedNodes"]) == set(names)
        assert snapshots() == before
        accounting = s.h.accounting
        assert accounting is not None and not any(n in accounting.ledger.nodes for n in names)
