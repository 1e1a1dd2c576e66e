"""A running system for hostile input (tests/chaos/test_fuzz.py, test_over_long_names.py).

Its own nats-server (a long-lived accounting in the session broker's queue group would answer
other tests' requests), the API emulator in process, and svc_accounting, svc_refit and
svc_scheduler as `numafit run` processes, so that a crash is an exit and a lost NATS connection
shows on /readyz. The hypothesis tests are synchronous (hypothesis drives them example by
example), so everything asynchronous lives on one event loop in a background thread and each
step is run there with `Hostile.run`.
"""

from __future__ import annotations

import asyncio
import io
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import nats.errors
import orjson

from shared import subjects
from shared.accounting_client import AccountingUnavailable
from shared.core.webhook_rules import DEFAULT_SCHEDULER_NAME
from shared.service import natsconn
from shared.testing.kube_emulator import KubeEmulator
from shared.testing.nats_server import NatsServer
from tests.builders import container, gpu, node, pod
from tests.chaos.support import (
    NO_REPLY,
    NO_RESPONDERS,
    REFUSED,
    Requester,
    ServiceProcess,
    annotations_of,
    control_line_bytes,
    create,
    decodes_to_object,
    entry_devices,
    kube_for,
    refit_body,
    reserved_pod,
    scheduler,
    service,
    stop_all,
)
from tests.raw_accounting import RawAccounting

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterator
    from pathlib import Path

    from nats.aio.client import Client

    from shared.service.kube_io import Kube

T = TypeVar("T")

INTERNAL_ERROR = "internal error"
"""What a service answers when an exception escaped its handler: the NATS form of a 500."""
SILENT = "does not answer"
"""Part of every violation that means a service stopped answering."""


class Silent(Exception):
    """A service did not answer at all."""


class LoopThread:
    """An event loop running in a daemon thread; `run` executes a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="chaos-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@dataclass
class Hostile:
    loop: LoopThread
    emulator: KubeEmulator
    kube: Kube
    nats_url: str
    accounting: ServiceProcess
    refit: ServiceProcess
    scheduler: ServiceProcess
    listen_port: int
    session: aiohttp.ClientSession
    connection: natsconn.NatsConnection
    requester: Requester
    refit_probe_uid: str
    bind_probe_uid: str
    filter_probe_uid: str

    @property
    def nc(self) -> Client:
        return self.connection.client

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return self.loop.run(coro, timeout)

    @property
    def services(self) -> list[ServiceProcess]:
        return [self.accounting, self.refit, self.scheduler]

    # --- state ------------------------------------------------------------------------------

    async def state(self) -> tuple[Any, ...]:
        """Everything hostile input must not change: every pod and node as the API server
        stores them (resourceVersions included) and accounting's whole ledger (its epoch
        changes if it restarted). Raises Silent when accounting does not answer."""
        pods, _ = self.emulator.store.list("pods")
        nodes, _ = self.emulator.store.list("nodes")
        try:
            ledger = await RawAccounting(self.nc).snapshot_all(budget=3.0)
        except AccountingUnavailable as exc:
            raise Silent(f"accounting {SILENT} a cluster snapshot: {exc}") from exc
        return pods, nodes, ledger

    async def checked(self, what: str, case: Coroutine[Any, Any, list[str]]) -> list[str]:
        """`case`'s problems, and any exception it raised as one more (hypothesis must see
        none: a replay of a failed example would meet the state it left behind)."""
        try:
            return await case
        except Silent as exc:
            return [f"{what}: {exc}"]
        except Exception as exc:  # every failure is reported, none raised
            return [f"{what}: the check failed: {exc!r}"]

    # --- requests ---------------------------------------------------------------------------

    async def post(self, path: str, payload: bytes) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{self.listen_port}{path}"
        headers = {"Content-Type": "application/json"}
        # aiohttp warns about large raw bodies (they are written in one go); stream those.
        data: bytes | io.BytesIO = payload if len(payload) < 1 << 16 else io.BytesIO(payload)
        async with asyncio.timeout(5):
            async with self.session.post(url, data=data, headers=headers) as response:
                return response.status, await response.read()

    async def pod(self, uid: str) -> dict[str, Any]:
        pods, _ = await self.kube.list_pods()
        return next(p for p in pods if p["metadata"]["uid"] == uid)

    # --- checks -----------------------------------------------------------------------------

    async def nats_case(self, kind: str, subject: str, payload: bytes) -> list[str]:
        """One hostile request over NATS; what went wrong (nothing, ideally)."""
        what = f"{subject[:80]!r} {payload[:300]!r}"
        return await self.checked(what, self._nats_case(kind, subject, payload, what))

    async def _nats_case(self, kind: str, subject: str, payload: bytes, what: str) -> list[str]:
        before = await self.state()
        outcome = await self.requester.request(subject, payload)
        problems = []
        deliverable = (
            subject.count(".") == subjects.REFIT_PREFIX.count(".") + 1 + (kind != "refit")
            and not any(c in subject for c in " \t\r\n")
            and not subject.endswith(".")
            and control_line_bytes(subject, payload) <= 4000
        )
        if isinstance(outcome, bytes):
            reply = decodes_to_object(outcome)
            if reply is None:
                problems.append(f"reply is not a JSON object: {outcome[:200]!r}")
            elif kind == "refit" and (
                reply.get("succeeded") is not False or reply.get("failureReason") == INTERNAL_ERROR
            ):
                problems.append(f"refit answered {reply}")
            elif kind != "refit" and (
                not isinstance(reply.get("ok"), bool) or reply.get("error") == INTERNAL_ERROR
            ):
                problems.append(f"accounting answered {str(reply)[:300]}")
        elif deliverable:
            problems.append(f"the service {SILENT} a request the broker delivers ({outcome})")
        else:
            assert outcome in (NO_RESPONDERS, NO_REPLY, REFUSED)
        if await self.state() != before:
            problems.append("the ledger or the API objects changed")
        return [f"{what}: {p}" for p in problems]

    async def http_case(self, path: str, payload: bytes) -> list[str]:
        what = f"POST {path} {payload[:300]!r}"
        return await self.checked(what, self._http_case(path, payload, what))

    async def _http_case(self, path: str, payload: bytes, what: str) -> list[str]:
        before = await self.state()
        try:
            status, raw = await self.post(path, payload)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise Silent(f"the scheduler {SILENT} within 5 s: {exc!r}") from exc
        problems = []
        if status >= 500:
            problems.append(f"HTTP {status}: {raw[:300]!r}")
        elif status in (200, 400):
            try:
                orjson.loads(raw)
            except orjson.JSONDecodeError:
                problems.append(f"HTTP {status} with a body that is not JSON: {raw[:200]!r}")
        if await self.state() != before:
            problems.append("the ledger or the API objects changed")
        return [f"{what}: {p}" for p in problems]

    # --- the system still works -------------------------------------------------------------

    async def problems_serving(self, within: float = 5.0) -> list[str]:
        """Why the services no longer do their job (nothing, ideally): each process alive and
        ready, and each answering a valid request, allowing `within` seconds to recover (a
        dropped NATS connection is re-established after half a second)."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            problems = await self._problems_serving()
            if not problems or asyncio.get_running_loop().time() > deadline:
                return problems
            await asyncio.sleep(0.1)

    async def _problems_serving(self) -> list[str]:
        problems = []
        for proc in self.services:
            assert proc.process is not None
            if proc.process.poll() is not None:
                problems.append(f"{proc.target} exited with {proc.process.returncode}")
            elif (status := await proc.readyz()) != 200:
                problems.append(f"{proc.target} /readyz is {status}")
        if problems:
            return problems
        probe = await self.pod(self.refit_probe_uid)
        reply = await self.nats_request(
            subjects.refit("node-1"), refit_body(probe, ["GPU-a", "GPU-b"])
        )
        if reply.get("code") != "already_aligned":
            problems.append(f"a valid refit got {reply}")
        snapshot = await self.nats_request(
            subjects.accounting("snapshot", "node-1"), {"node": "node-1"}
        )
        if snapshot.get("ok") is not True:
            problems.append(f"a valid snapshot got {str(snapshot)[:300]}")
        plain = pod("plain", containers=[container("web", None)], namespace="ml", node_name="")
        status, raw = await self.post(
            "/filter", orjson.dumps({"Pod": plain, "NodeNames": ["node-1"]})
        )
        if status != 200 or orjson.loads(raw).get("NodeNames") != ["node-1"]:
            problems.append(f"a valid /filter got HTTP {status}: {raw[:300]!r}")
        return problems

    async def nats_request(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            msg = await natsconn.request(self.nc, subject, orjson.dumps(body), 3)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
            return {"error": repr(exc)}
        reply: dict[str, Any] = orjson.loads(msg.data)
        return reply

    async def move_refit_probe(self) -> dict[str, Any]:
        """A refit that really moves: the probe pod to the GPU it is not on."""
        probe = await self.pod(self.refit_probe_uid)
        current = entry_devices(annotations_of(probe)["hami.io/vgpu-devices-to-allocate"])
        other = "GPU-b" if current[0][0][0] == "GPU-a" else "GPU-a"
        return await self.nats_request(subjects.refit("node-1"), refit_body(probe, [other]))

    async def filter_probe(self) -> tuple[int, dict[str, Any]]:
        """A valid /filter of a pending GPU pod: it is reserved on node-1."""
        probe = await self.pod(self.filter_probe_uid)
        status, raw = await self.post(
            "/filter", orjson.dumps({"Pod": probe, "NodeNames": ["node-1"]})
        )
        body: dict[str, Any] = orjson.loads(raw)
        return status, body


def pending_gpu_pod(name: str) -> dict[str, Any]:
    """A GPU pod not scheduled yet, routed to numafit (as its webhook would)."""
    body = pod(name, containers=[container("main", 1, 5000, 5)], namespace="ml", node_name="")
    body["spec"]["schedulerName"] = DEFAULT_SCHEDULER_NAME
    return body


async def _open(
    nats_url: str, workdir: Path, emulator: KubeEmulator
) -> tuple[Kube, aiohttp.ClientSession, natsconn.NatsConnection, Requester, dict[str, str]]:
    await emulator.start()
    kubeconfig = emulator.write_kubeconfig(workdir / "kubeconfig")
    kube = await kube_for(kubeconfig)
    await create(kube, "node", node("node-1", [gpu("GPU-a", 0), gpu("GPU-b", 1)]))
    refit_probe = await create(kube, "pod", reserved_pod("refit-probe", "GPU-a", 10000, 10))
    filter_probe = await create(kube, "pod", pending_gpu_pod("filter-probe"))
    bind_probe = await create(kube, "pod", pending_gpu_pod("bind-probe"))
    uids = {
        "refit": refit_probe["metadata"]["uid"],
        "filter": filter_probe["metadata"]["uid"],
        "bind": bind_probe["metadata"]["uid"],
    }
    session = aiohttp.ClientSession()
    connection = await natsconn.connect(nats_url, "chaos-hostile")
    return kube, session, connection, Requester(nats_url), uids


def open_hostile(workdir: Path) -> Iterator[Hostile]:
    """The generator behind the package fixture: start everything, yield, stop everything."""
    loop = LoopThread()
    emulator = KubeEmulator()
    try:
        with NatsServer() as broker:
            yield from _serve(loop, broker, emulator, workdir)
    finally:
        loop.run(emulator.stop())
        loop.close()


def _serve(
    loop: LoopThread, broker: NatsServer, emulator: KubeEmulator, workdir: Path
) -> Iterator[Hostile]:
    kube, session, connection, requester, uids = loop.run(_open(broker.url, workdir, emulator))
    kubeconfig = workdir / "kubeconfig"
    accounting = service("accounting", broker.url, kubeconfig, workdir)
    refit = service("refit", broker.url, kubeconfig, workdir)
    sched, listen_port = scheduler(broker.url, kubeconfig, workdir)
    env = Hostile(
        loop,
        emulator,
        kube,
        broker.url,
        accounting,
        refit,
        sched,
        listen_port,
        session,
        connection,
        requester,
        uids["refit"],
        uids["bind"],
        uids["filter"],
    )
    try:
        accounting.start()
        refit.start()
        loop.run(accounting.wait_ready())
        sched.start()
        loop.run(refit.wait_ready())
        loop.run(sched.wait_ready())
        yield env
    finally:
        stop_all(env.services)
        loop.run(_close(env))


async def _close(env: Hostile) -> None:
    await env.requester.close()
    await env.connection.close()
    await env.session.close()
    await env.kube.api.close()
