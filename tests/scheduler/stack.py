"""The scheduler under test beside the control-plane harness: API emulator, real nats-server,
real svc_accounting, and svc_scheduler in process, spoken to over real HTTP."""

from __future__ import annotations

import contextlib
import copy
import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from shared import subjects
from shared.core import keys
from shared.messages import SnapshotReply, SnapshotRequest
from svc_accounting.ledger import RESERVATION_KEYS
from svc_scheduler.service import SchedulerOptions, SchedulerService, spec
from tests.builders import container, gpu, node, pod
from tests.integration.harness import Harness, harness

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

NUMAFIT = "numafit-scheduler"
"""The scheduler name numafit schedules by default (DEFAULT_SCHEDULER_NAME)."""


@dataclass
class Stack:
    h: Harness
    scheduler: SchedulerService
    session: aiohttp.ClientSession

    async def post(self, path: str, body: Any, *, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else orjson.dumps(body)
        async with self.session.post(
            self.scheduler.url + path,
            data=io.BytesIO(data),  # large bodies too, without blocking the loop
            headers={"Content-Type": "application/json"},
        ) as response:
            return response.status, orjson.loads(await response.read())

    async def filter(self, pod_obj: dict[str, Any], names: list[str]) -> dict[str, Any]:
        status, body = await self.post("/filter", {"Pod": pod_obj, "NodeNames": names})
        assert status == 200, body
        result: dict[str, Any] = body
        return result

    async def bind(self, created: dict[str, Any], node_name: str) -> None:
        """kube-scheduler's bind through the extender, which must succeed."""
        meta = created["metadata"]
        args = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node_name,
        }
        status, body = await self.post("/bind", args)
        assert (status, body) == (200, {"Error": ""}), body

    async def annotations(self, namespace: str, name: str) -> dict[str, str]:
        current = await self.h.pod(namespace, name)
        result: dict[str, str] = current["metadata"].get("annotations") or {}
        return result

    async def reservation(self, namespace: str, name: str) -> dict[str, str]:
        """The pod's reservation annotations as accounting holds them: held since its filter
        (not yet on the pod) or written by its bind; empty when it has none."""
        uid = (await self.h.pod(namespace, name))["metadata"]["uid"]
        reply = await self.h.client.ask(
            SnapshotRequest(node=subjects.ALL_NODES, pod_uid=uid, limit=1), SnapshotReply
        )
        if not reply.pod:
            return {}
        annotations = reply.pod.pod.metadata.annotations
        return {k: v for k, v in annotations.items() if k in RESERVATION_KEYS}

    async def revision(self, node_name: str) -> int:
        reply = await self.h.client.ask(SnapshotRequest(node=node_name), SnapshotReply)
        assert reply.nodes
        return reply.nodes[0].revision


@contextlib.asynccontextmanager
async def stack(
    nats_url: str, tmp_path: Path, objects: list[tuple[str, dict[str, Any]]], **options: Any
) -> AsyncIterator[Stack]:
    """`options`: SchedulerOptions fields (the listener is always 127.0.0.1 on a free port)."""
    async with harness(nats_url, tmp_path, objects, with_refit=False) as h:
        chosen = SchedulerOptions(host="127.0.0.1", port=0, **options)
        scheduler = await h.wiring.start(spec(chosen), client_name="scheduler")
        try:
            async with aiohttp.ClientSession() as session:
                await scheduler.read_model.ready.wait()
                yield Stack(h, scheduler, session)
        finally:
            await h.wiring.stop(scheduler, 1.0)


def for_create(obj: dict[str, Any]) -> dict[str, Any]:
    """What a client sends on create: no uid, no resourceVersion."""
    body = copy.deepcopy(obj)
    body["metadata"].pop("uid", None)
    body["metadata"].pop("resourceVersion", None)
    return body


def two_nodes(small_mem: int = 10000) -> list[tuple[str, dict[str, Any]]]:
    """node-1 with one 40 GB GPU (GPU-a), node-2 with one small GPU (GPU-z)."""
    return [
        ("node", node("node-1", [gpu("GPU-a", 0)])),
        ("node", node("node-2", [gpu("GPU-z", 0, mem=small_mem)])),
    ]


def pending_pod(
    name: str,
    mem: int = 20000,
    cores: int = 30,
    *,
    namespace: str = "ml",
    annotations: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    scheduler: str | None = NUMAFIT,
) -> dict[str, Any]:
    """An unscheduled GPU pod, ready to create, of `scheduler`: by default numafit's own, as
    the webhook would have routed it; None names none, as a user's manifest (the emulator
    then gives it `default-scheduler`)."""
    body = for_create(
        pod(
            name,
            containers=containers or [container("main", 1, mem, cores)],
            init=init,
            namespace=namespace,
            node_name="",
            annotations=annotations,
        )
    )
    if scheduler is not None:
        body["spec"]["schedulerName"] = scheduler
    return body


def reserved_pod(name: str, node_name: str, allocated: str) -> dict[str, Any]:
    """A pod placed earlier (accounting adopts its reservation when it rebuilds)."""
    return for_create(
        pod(
            name,
            containers=[container("main", 1, 20000, 30)],
            namespace="ml",
            node_name=node_name,
            allocated=allocated,
            annotations={keys.BIND_PHASE: keys.PHASE_SUCCESS},
            phase="Running",
        )
    )
