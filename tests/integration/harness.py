"""An in-process numafit control plane for integration tests: the Kubernetes API emulator
(spoken to by the real kubernetes_asyncio client), a real nats-server, svc_accounting and
svc_refit, each wired by its package's spec as `numafit run` wires it (own NATS connection,
Kubernetes client and metrics registry)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import TYPE_CHECKING, Any

import orjson

from shared import subjects
from shared.service import natsconn
from shared.service.wiring import InProcess
from shared.testing.kube_emulator import KubeEmulator
from svc_accounting import service as accounting_service
from svc_refit import service as refit_service
from tests.raw_accounting import RawAccounting
from tests.raw_kube import raw

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from nats.aio.client import Client

    from shared.service.kube_io import Kube
    from svc_accounting.service import AccountingService
    from svc_refit.service import RefitService


class Harness:
    def __init__(self, emulator: KubeEmulator, kubeconfig: Path, nats_url: str) -> None:
        self.emulator = emulator
        self.kubeconfig = kubeconfig
        self.nats_url = nats_url
        self.wiring = InProcess(nats_url, kubeconfig)
        self.accounting: AccountingService | None = None
        self.refit: RefitService | None = None
        self.client_nc: Client | None = None
        self.kube: Kube | None = None
        self.accounting_reconnected = asyncio.Event()
        self.accounting_options = accounting_service.AccountingOptions(
            lease_bucket=f"numafit-test-{uuid.uuid4().hex[:12]}"
        )
        """Each harness its own lease bucket: tests share a broker, and a replica a test
        killed must not hold the next test's partitions until its leases expire."""

    async def _kube(self, component: str) -> Kube:
        return await self.wiring.kube(component)

    async def _nats(self, name: str) -> Client:
        return (await self.wiring.nats(name)).client

    async def start(self) -> None:
        self.kube = await self._kube("test")
        self.client_nc = await self._nats("test-client")
        await self.start_accounting()
        await self.start_refit()

    async def start_accounting(self) -> AccountingService:
        async def observed() -> None:  # runs after accounting's own hook
            self.accounting_reconnected.set()

        self.accounting = await self.wiring.start(
            accounting_service.spec(self.accounting_options),
            client_name="accounting",
            hooks=[observed],
        )
        return self.accounting

    async def start_refit(self) -> RefitService:
        self.refit = await self.wiring.start(refit_service.spec(), client_name="refit")
        return self.refit

    async def stop(self) -> None:
        """Stop every service (refit first), then close every client."""
        await self.wiring.close(1.0)

    @property
    def client(self) -> RawAccounting:
        assert self.client_nc is not None
        return RawAccounting(self.client_nc)

    async def refit_request(
        self, body: Any, node: str = "node-1", raw: bytes | None = None
    ) -> dict[str, Any]:
        assert self.client_nc is not None
        payload = raw if raw is not None else orjson.dumps(body)
        msg = await natsconn.request(self.client_nc, subjects.refit(node), payload, 5)
        reply: dict[str, Any] = orjson.loads(msg.data)
        return reply

    async def create(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        assert self.kube is not None
        core = self.kube.core
        if kind == "node":
            response = await raw(
                core.create_node(obj, _preload_content=False)  # type: ignore[arg-type]  # JSON body, not the model: tests/raw_kube.py
            )
        elif kind == "quota":
            response = await raw(
                core.create_namespaced_resource_quota(
                    obj["metadata"]["namespace"],
                    obj,  # type: ignore[arg-type]  # JSON body, not the model: tests/raw_kube.py
                    _preload_content=False,
                )
            )
        else:
            response = await raw(
                core.create_namespaced_pod(
                    obj["metadata"]["namespace"],
                    obj,  # type: ignore[arg-type]  # JSON body, not the model: tests/raw_kube.py
                    _preload_content=False,
                )
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
                await h.start_refit()
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
