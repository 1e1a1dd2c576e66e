"""An in-process numafit control plane for integration tests: the Kubernetes API emulator
(spoken to by the real kubernetes_asyncio client), a real nats-server, svc_accounting and
svc_refit, each with its own NATS connection as in production."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
from nats.aio.client import Client

from shared import subjects
from shared.accounting_client import AccountingClient
from shared.kube_emulator import KubeEmulator
from shared.service import natsconn
from shared.service.kube import api_client
from shared.service.kube_io import Kube
from svc_accounting.service import AccountingService
from svc_refit.service import RefitService


class Harness:
    def __init__(self, emulator: KubeEmulator, kubeconfig: Path, nats_url: str) -> None:
        self.emulator = emulator
        self.kubeconfig = kubeconfig
        self.nats_url = nats_url
        self.closers: list[Callable[[], Any]] = []
        self.accounting: AccountingService | None = None
        self.refit: RefitService | None = None
        self.client_nc: Client | None = None
        self.kube: Kube | None = None
        self.accounting_reconnected = asyncio.Event()

    async def _kube(self, component: str) -> Kube:
        api = await api_client(str(self.kubeconfig))
        self.closers.append(api.close)
        return Kube(api, component)

    async def _nats(self, name: str, hooks: list[natsconn.ReconnectHook] | None = None) -> Client:
        nc = await natsconn.connect(self.nats_url, name, on_reconnect=hooks)
        self.closers.append(nc.close)
        return nc

    async def start(self) -> None:
        self.kube = await self._kube("test")
        self.client_nc = await self._nats("test-client")
        await self.start_accounting()
        self.refit = RefitService(await self._nats("refit"), await self._kube("numafit-refit"))
        await self.refit.start()

    async def start_accounting(self) -> AccountingService:
        hooks: list[natsconn.ReconnectHook] = []
        accounting = AccountingService(
            await self._nats("accounting", hooks), await self._kube("numafit-accounting")
        )
        hooks.append(accounting.on_reconnect)

        async def observed() -> None:  # runs after accounting's own hook
            self.accounting_reconnected.set()

        hooks.append(observed)
        await accounting.start()
        self.accounting = accounting
        return accounting

    async def stop(self) -> None:
        if self.refit is not None:
            await self.refit.stop(1.0)
        if self.accounting is not None:
            await self.accounting.stop(1.0)
        for close in reversed(self.closers):
            with contextlib.suppress(Exception):
                await close()

    @property
    def client(self) -> AccountingClient:
        assert self.client_nc is not None
        return AccountingClient(self.client_nc)

    async def refit_request(
        self, body: Any, node: str = "node-1", raw: bytes | None = None
    ) -> dict[str, Any]:
        assert self.client_nc is not None
        payload = raw if raw is not None else orjson.dumps(body)
        msg = await self.client_nc.request(subjects.refit(node), payload, timeout=5)
        reply: dict[str, Any] = orjson.loads(msg.data)
        return reply

    async def create(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        assert self.kube is not None
        core = self.kube.core
        if kind == "node":
            response = await core.create_node(obj, _preload_content=False)
        elif kind == "quota":
            response = await core.create_namespaced_resource_quota(
                obj["metadata"]["namespace"], obj, _preload_content=False
            )
        else:
            response = await core.create_namespaced_pod(
                obj["metadata"]["namespace"], obj, _preload_content=False
            )
        body: dict[str, Any] = orjson.loads(await response.read())
        assert response.status < 300, body
        return body

    async def pod(self, namespace: str, name: str) -> dict[str, Any]:
        assert self.kube is not None
        return await self.kube.get_pod(namespace, name)


@contextlib.asynccontextmanager
async def harness(
    nats_url: str,
    tmp_path: Path,
    objects: list[tuple[str, dict[str, Any]]],
    *,
    with_refit: bool = True,
) -> AsyncIterator[Harness]:
    """Create `objects` in the emulator first (so accounting rebuilds from them), then start."""
    async with KubeEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        h = Harness(emulator, kubeconfig, nats_url)
        try:
            h.kube = await h._kube("test")
            for kind, obj in objects:
                await h.create(kind, obj)
            h.client_nc = await h._nats("test-client")
            await h.start_accounting()
            if with_refit:
                h.refit = RefitService(await h._nats("refit"), await h._kube("numafit-refit"))
                await h.refit.start()
            yield h
        finally:
            await h.stop()


async def wait_for(predicate: Callable[[], Any], within: float = 5.0) -> None:
    """Wait until `predicate` holds, bounded by `within` seconds.

    For state owned by another component (the API server, a NATS connection) that offers no
    notification to await, the condition is re-checked every 10 ms; the bound makes a test
    that never sees it fail instead of hanging.
    """
    async with asyncio.timeout(within):
        while not await _value(predicate()):  # noqa: ASYNC110 - polling foreign state, bounded
            await asyncio.sleep(0.01)


async def _value(result: Any) -> Any:
    return await result if asyncio.iscoroutine(result) else result
