"""One way to wire a service: its package's `spec(options)` says how to build it, and the same
spec is run by `numafit run X` (through `runner.serve_spec`), by `numafit simulate`, by
`numafit bench` and by the test harnesses (through `InProcess`).

A `ServiceSpec` holds the service's name (the NATS client name and the Kubernetes component),
its readiness conditions, whether it has a Kubernetes client, and `build`: the clients, a
metrics registry and the readiness in, the service out. Everything else (the service's own
options, parsed from its flags) is bound into `build` by the package's `spec`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from nats.aio.client import Client
from prometheus_client import CollectorRegistry

from shared.service import natsconn
from shared.service.health import Readiness
from shared.service.kube import api_client
from shared.service.kube_io import Kube

if TYPE_CHECKING:
    from pathlib import Path


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self, grace: float) -> None: ...


S = TypeVar("S", bound=Service)

Factory = Callable[
    [Client, Kube | None, CollectorRegistry, Readiness], Awaitable[Service] | Service
]
"""What the run loop calls with the clients it made: (nats, kube, registry, readiness)."""


@dataclass(frozen=True, slots=True)
class ServiceSpec(Generic[S]):
    name: str
    """`numafit-<service>`: the NATS client name, the Kubernetes component, the log field."""
    conditions: tuple[str, ...]
    """The readiness conditions the service sets; /readyz answers 200 once all are."""
    build: Callable[[Client, Kube | None, CollectorRegistry, Readiness], S]
    use_kube: bool = True
    """False: the service gets no Kubernetes client at all (the device plugin)."""

    def readiness(self) -> Readiness:
        return Readiness(*self.conditions)

    def make(
        self,
        nc: Client,
        kube: Kube | None,
        registry: CollectorRegistry | None = None,
        readiness: Readiness | None = None,
    ) -> S:
        """The service, not started; a fresh registry and readiness unless given."""
        return self.build(
            nc,
            kube,
            registry if registry is not None else CollectorRegistry(auto_describe=True),
            readiness if readiness is not None else self.readiness(),
        )


def reconnect_hook(service: object) -> natsconn.ReconnectHook | None:
    """The service's `on_reconnect`, when it has one (run after every NATS reconnect)."""
    hook: natsconn.ReconnectHook | None = getattr(service, "on_reconnect", None)
    return hook


class InProcess:
    """Services run in this process, each wired as the run loop wires it in a process of its
    own: its own NATS connection (with its reconnect hook), Kubernetes client and metrics
    registry. `close` stops what it started, in reverse, and closes every client."""

    def __init__(self, nats_url: str, kubeconfig: str | Path | None = None) -> None:
        self.nats_url = nats_url
        self.kubeconfig = str(kubeconfig) if kubeconfig is not None else None
        self._services: list[Service] = []
        self._closers: list[Callable[[], Awaitable[object]]] = []

    async def nats(self, name: str) -> natsconn.NatsConnection:
        """A connection of this process's, closed (not drained) by `close`."""
        connection = await natsconn.connect(self.nats_url, name)
        self._closers.append(connection.client.close)
        return connection

    async def kube(self, component: str) -> Kube:
        if self.kubeconfig is None:
            raise RuntimeError("no kubeconfig: this process has no Kubernetes API")
        api = await api_client(self.kubeconfig)
        self._closers.append(api.close)
        return Kube(api, component)

    async def start(
        self,
        spec: ServiceSpec[S],
        *,
        client_name: str | None = None,
        registry: CollectorRegistry | None = None,
        readiness: Readiness | None = None,
        hooks: list[natsconn.ReconnectHook] | None = None,
    ) -> S:
        """Build and start one service. `hooks` run after the service's own reconnect hook."""
        connection = await self.nats(client_name or spec.name)
        kube = await self.kube(spec.name) if spec.use_kube and self.kubeconfig else None
        service = spec.make(connection.client, kube, registry, readiness)
        for hook in (reconnect_hook(service), *(hooks or [])):
            if hook is not None:
                connection.on_reconnect(hook)
        self._services.append(service)
        await service.start()
        return service

    async def stop(self, service: Service, grace: float = 1.0) -> None:
        """Stop one service started here (the others keep running)."""
        if service in self._services:
            self._services.remove(service)
        await service.stop(grace)

    async def close(self, grace: float = 1.0) -> None:
        """Stop every service still running (the last started first), then close the
        clients; the first error of a stop is raised once everything is closed."""
        errors: list[Exception] = []
        while self._services:
            try:
                await self._services.pop().stop(grace)
            except Exception as exc:
                errors.append(exc)
        while self._closers:
            with contextlib.suppress(Exception):
                await self._closers.pop()()
        if errors:
            raise errors[0]
