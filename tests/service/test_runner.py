"""The run loop every service shares: a service that can no longer do its job says so on /readyz
and stops with an error (exit 1 from `numafit run`), so Kubernetes restarts it.

Two ways a service loses its job are driven for real here: nats-server closing the connection
for a protocol violation (nats-py never reconnects after that), and an eternal background task
ending. A plain SIGTERM still stops cleanly.
"""

from __future__ import annotations

import asyncio
import gc
from typing import TYPE_CHECKING

import aiohttp
import pytest

from shared.service.health import Readiness
from shared.service.runner import ServiceFailed, serve
from shared.service.settings import CommonSettings
from shared.service.supervisor import Supervisor
from shared.testing.nats_server import NatsServer
from tests.integration.processes import free_port
from tests.service.test_heap import frozen

if TYPE_CHECKING:
    from pathlib import Path

    from nats.aio.client import Client
    from prometheus_client import CollectorRegistry

    from shared.service.kube_io import Kube


class Probe:
    """A minimal service: holds its connection, marks itself ready, optionally runs a task."""

    def __init__(self, nc: Client, readiness: Readiness, eternal: bool) -> None:
        self.nc = nc
        self.readiness = readiness
        self.supervisor = Supervisor("probe", on_fatal=readiness.fail)
        self.eternal = eternal
        self.crash = asyncio.Event()
        self.stopped = False

    async def start(self) -> None:
        await self.supervisor.start()
        if self.eternal:
            self.supervisor.spawn(self._loop(), "probe-loop", eternal=True)
        self.readiness.set("probe")

    async def _loop(self) -> None:
        await self.crash.wait()
        raise RuntimeError("the loop hit a bug")

    async def stop(self, grace: float) -> None:
        self.stopped = True
        await self.supervisor.stop(grace)


def settings(url: str, port: int) -> CommonSettings:
    return CommonSettings(
        nats_url=url,
        kubeconfig=None,
        metrics_host="127.0.0.1",
        metrics_port=port,
        log_level="info",
        log_format="json",
        grace_seconds=2.0,
        nats_connect_timeout=5.0,
    )


async def readyz(port: int) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/readyz") as response,
    ):
        return response.status


async def run_probe(
    url: str, eternal: bool = False, stop: asyncio.Event | None = None
) -> tuple[asyncio.Task[None], Probe, int]:
    """`serve` a Probe until it is ready; `stop` given: it stands in for SIGTERM."""
    port = free_port()
    made: list[Probe] = []
    readiness = Readiness("probe")

    def factory(
        nc: Client, _kube: Kube | None, _registry: CollectorRegistry, ready: Readiness
    ) -> Probe:
        made.append(Probe(nc, ready, eternal))
        return made[0]

    task = asyncio.create_task(
        serve("probe", settings(url, port), factory, readiness, stop, use_kube=False)
    )
    async with asyncio.timeout(10):
        while not made or not readiness.ready:  # noqa: ASYNC110 - state of the task under test
            await asyncio.sleep(0.01)
    assert await readyz(port) == 200
    return task, made[0], port


@pytest.fixture
def tight_server(tmp_path: Path) -> NatsServer:
    # A small control-line limit lets a test provoke the real close nats-server does for an
    # over-long protocol line (4096 bytes by default) without building a 4 KiB subject.
    config = tmp_path / "nats.conf"
    config.write_text("max_control_line: 256\n")
    return NatsServer(config=config)


async def test_a_connection_closed_for_good_fails_readiness_and_stops(
    tight_server: NatsServer,
) -> None:
    with tight_server as server:
        task, probe, _ = await run_probe(server.url)
        await probe.nc.publish("numafit." + "x" * 300, b"")  # the server closes on this line
        with pytest.raises(ServiceFailed, match="NATS connection closed"):
            async with asyncio.timeout(10):
                await asyncio.shield(task)
        assert probe.stopped
        assert probe.readiness.failure is not None
        assert not probe.readiness.ready


async def test_readiness_fails_before_the_process_exits(tight_server: NatsServer) -> None:
    with tight_server as server:
        task, probe, port = await run_probe(server.url)
        # Hold the stop up so /readyz can be read between the failure and the exit.
        stop_entered = asyncio.Event()
        release = asyncio.Event()
        original = probe.stop

        async def slow_stop(grace: float) -> None:
            stop_entered.set()
            await release.wait()
            await original(grace)

        probe.stop = slow_stop  # type: ignore[method-assign]
        await probe.nc.publish("numafit." + "x" * 300, b"")
        async with asyncio.timeout(10):
            await stop_entered.wait()
        assert await readyz(port) == 503
        release.set()
        with pytest.raises(ServiceFailed):
            async with asyncio.timeout(10):
                await task


async def test_an_eternal_task_that_ends_stops_the_service(nats_url: str) -> None:
    task, probe, _ = await run_probe(nats_url, eternal=True)
    probe.crash.set()
    with pytest.raises(ServiceFailed, match="probe-loop"):
        async with asyncio.timeout(10):
            await task
    assert probe.stopped


async def test_a_plain_stop_is_clean(nats_url: str) -> None:
    stop = asyncio.Event()
    task, probe, _ = await run_probe(nats_url, eternal=True, stop=stop)
    stop.set()
    async with asyncio.timeout(5):
        await task  # no ServiceFailed: the eternal task was cancelled by the stop, not ended
    assert probe.stopped and probe.readiness.failure is None


async def test_sigterm_finishes_within_one_grace_period(nats_url: str) -> None:
    """A stop that would take forever (a request stuck on a dead API server) is cut at the
    grace period; the connection is still drained and the loop returns."""
    stop = asyncio.Event()
    task, probe, port = await run_probe(nats_url, stop=stop)
    stuck = asyncio.Event()

    async def stop_forever(grace: float) -> None:
        await stuck.wait()

    probe.stop = stop_forever  # type: ignore[method-assign]
    stop.set()
    # Bounded past the 2 s grace: the run loop must not wait for the stuck stop.
    async with asyncio.timeout(settings(nats_url, port).grace_seconds + 3):
        await task
    assert probe.nc.is_closed


class LateLoader(Probe):
    """Ready only once it has loaded its state, after `start` returned (as the scheduler's read
    model takes its first snapshot of every node in the background)."""

    def __init__(self, nc: Client, readiness: Readiness) -> None:
        super().__init__(nc, readiness, eternal=False)
        self.go = asyncio.Event()
        self.loaded: list[list[int]] = []

    async def start(self) -> None:
        await super().start()
        self.supervisor.spawn(self._load(), "load")

    async def _load(self) -> None:
        await self.go.wait()
        self.loaded = [[n] for n in range(1000)]  # containers the cyclic GC tracks
        self.readiness.set("loaded")


async def test_the_heap_is_settled_once_the_service_is_ready_not_at_start(nats_url: str) -> None:
    """Frozen at start, a state loaded in the background would stay in the collector's view,
    re-scanned by every full collection (a 5000-node read model: 40-50 ms every ninth filter)."""
    stop = asyncio.Event()
    made: list[LateLoader] = []
    readiness = Readiness("probe", "loaded")

    def factory(
        nc: Client, _kube: Kube | None, _registry: CollectorRegistry, ready: Readiness
    ) -> LateLoader:
        made.append(LateLoader(nc, ready))
        return made[0]

    port = free_port()
    task = asyncio.create_task(
        serve("late", settings(nats_url, port), factory, readiness, stop, use_kube=False)
    )
    try:
        async with asyncio.timeout(10):
            while not made or not made[0].supervisor.running:  # noqa: ASYNC110 - task under test
                await asyncio.sleep(0.01)
        assert await readyz(port) == 503
        made[0].go.set()
        async with asyncio.timeout(10):
            while not (made[0].loaded and frozen(made[0].loaded[-1])):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert await readyz(port) == 200
    finally:
        stop.set()
        async with asyncio.timeout(5):
            await task
        gc.unfreeze()  # the rest of the test session collects as usual
