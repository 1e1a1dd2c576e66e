"""svc_accounting follows pods through the API server's watch: adoption, init shrink, release."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from shared.messages import TrackedPodWire
from tests.builders import container, gpu, node, pod
from tests.integration.harness import Harness, harness, wait_for
from tests.integration.test_refit_over_nats import for_create
from tests.raw_kube import raw

if TYPE_CHECKING:
    from pathlib import Path


def init_pod(name: str = "job") -> dict[str, Any]:
    return pod(
        name,
        init=[container("prep", 1, 30000)],
        containers=[container("main", 1, 20000)],
        namespace="ml",
        allocated="GPU-a,NVIDIA,30000,0:;GPU-a,NVIDIA,20000,0:;",
        to_allocate=";;",
    )


def gpu_node() -> dict[str, Any]:
    return node("node-1", [gpu("GPU-a", 0), gpu("GPU-b", 1)])


async def usedmem(h: Harness, uuid: str = "GPU-a") -> int:
    snapshot = await h.client.snapshot("node-1")
    pods = snapshot["nodes"][0]["pods"]
    total = 0
    for tracked in pods:
        # Accounting's own view, through the wire form every reader uses.
        entry = msgspec.convert(tracked, TrackedPodWire).to_core()
        if uuid in entry.usage:
            total += entry.usage[uuid].mem
    return total


async def set_status(h: Harness, name: str, status: dict[str, Any]) -> None:
    assert h.kube is not None
    response = await raw(
        h.kube.core.patch_namespaced_pod_status(  # type: ignore[call-arg]  # _content_type: not in the stubs
            name,
            "ml",
            {"status": status},
            _content_type="application/merge-patch+json",
            _preload_content=False,
        )
    )
    assert response.status == 200, await response.read()
    response.release()


async def test_init_shrink_release_and_adoption(nats_url: str, tmp_path: Path) -> None:
    async with harness(
        nats_url, tmp_path, [("node", gpu_node()), ("pod", for_create(init_pod()))]
    ) as h:
        assert await usedmem(h) == 30000  # the init phase peak

        # The init container exits 0: steady state (the app's 20000) from now on.
        await set_status(
            h,
            "job",
            {
                "phase": "Pending",
                "initContainerStatuses": [
                    {"name": "prep", "state": {"terminated": {"exitCode": 0}}}
                ],
            },
        )

        async def shrunk() -> bool:
            return await usedmem(h) == 20000

        await wait_for(shrunk)

        # A pod placed by someone else (HAMi, a previous accounting) is adopted from its
        # annotations.
        await h.create(
            "pod",
            for_create(
                pod(
                    "other",
                    containers=[container("c", 1, 5000)],
                    namespace="ml",
                    allocated="GPU-a,NVIDIA,5000,0:;",
                )
            ),
        )

        async def adopted() -> bool:
            return await usedmem(h) == 25000

        await wait_for(adopted)

        # Terminal phase releases the reservation ...
        await set_status(h, "job", {"phase": "Succeeded"})

        async def released() -> bool:
            return await usedmem(h) == 5000

        await wait_for(released)

        # ... and so does deletion.
        assert h.kube is not None
        response = await raw(
            h.kube.core.delete_namespaced_pod("other", "ml", _preload_content=False)
        )
        response.release()

        async def empty() -> bool:
            return await usedmem(h) == 0

        await wait_for(empty)


async def test_failed_init_holds_the_peak(nats_url: str, tmp_path: Path) -> None:
    async with harness(
        nats_url, tmp_path, [("node", gpu_node()), ("pod", for_create(init_pod()))]
    ) as h:
        await set_status(
            h,
            "job",
            {"initContainerStatuses": [{"name": "prep", "state": {"terminated": {"exitCode": 1}}}]},
        )
        revision = (await h.client.snapshot("node-1"))["nodes"][0]["revision"]
        # Touch the pod again so the watch has certainly delivered the status change.
        await set_status(h, "job", {"message": "retrying"})

        async def seen() -> bool:
            assert h.accounting is not None
            tracked = h.accounting.ledger.tracked((await h.pod("ml", "job"))["metadata"]["uid"])
            return (
                tracked is not None
                and tracked.pod.resource_version
                == (await h.pod("ml", "job"))["metadata"]["resourceVersion"]
            )

        await wait_for(seen)
        assert await usedmem(h) == 30000
        assert (await h.client.snapshot("node-1"))["nodes"][0]["revision"] == revision


async def test_micro_service_discovery(nats_url: str, tmp_path: Path) -> None:
    async with harness(nats_url, tmp_path, [("node", gpu_node())]) as h:
        assert h.client_nc is not None and h.accounting is not None
        await h.client.snapshot("node-1")
        info = orjson.loads(
            (await h.client_nc.request("$SRV.INFO.numafit-accounting", b"", timeout=2)).data
        )
        assert info["name"] == "numafit-accounting"
        # Discovery only: accounting's requests come by subscriptions that follow partition
        # ownership (svc_accounting/routes.py), which nats.micro endpoints cannot do.
        assert info["endpoints"] == []
        assert info["metadata"]["partitions"].isdigit()
        assert info["metadata"]["replica"] == h.accounting.replica
        ping = orjson.loads(
            (await h.client_nc.request("$SRV.PING.numafit-refit", b"", timeout=2)).data
        )
        assert ping["type"] == "io.nats.micro.v1.ping_response"
        refit_info = orjson.loads(
            (await h.client_nc.request("$SRV.INFO.numafit-refit", b"", timeout=2)).data
        )
        assert refit_info["endpoints"][0]["subject"] == "numafit.refit.v1.*"
        assert refit_info["endpoints"][0]["queue_group"] == "numafit-refit"


async def test_cluster_snapshots_are_paged(nats_url: str, tmp_path: Path) -> None:
    nodes = [("node", node(f"node-{i}", [gpu(f"GPU-{i}", 0)])) for i in range(5)]
    async with harness(nats_url, tmp_path, nodes) as h:
        first = await h.client.call("snapshot", "_all", {"limit": 2})
        assert [n["node"] for n in first["nodes"]] == ["node-0", "node-1"]
        assert first["more"] is True and first["next"] == "node-1"
        everything = await h.client.snapshot_all(page=2)
        assert [n["node"] for n in everything["nodes"]] == [f"node-{i}" for i in range(5)]
