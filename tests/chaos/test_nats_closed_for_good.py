"""A service whose NATS connection the server closes for good: not ready, then exit 1.

The broker has a user per service; reloading its configuration with the services' passwords
changed (credentials revoked, as an operator rotating secrets would) makes nats-server end
their connections with `-ERR 'Authorization Violation'`, after which nats-py never reconnects.
Each service must then fail /readyz and exit with status 1, so Kubernetes restarts it. To see
accounting's /readyz answer 503 before it exits, one of its operations is in flight (its pod
PATCH held by the API emulator): stopping lets in-flight work finish within the grace period.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import TYPE_CHECKING, Any

import aiohttp
import nats.errors
import orjson

from shared import subjects
from shared.core import keys
from shared.service import natsconn
from shared.testing.kube_emulator import KubeEmulator
from shared.testing.nats_server import NatsServer
from tests.builders import gpu, node
from tests.chaos.support import (
    ServiceProcess,
    create,
    kube_for,
    reserved_pod,
    scheduler,
    service,
    stop_all,
    tally,
)
from tests.integration.harness import wait_for

if TYPE_CHECKING:
    from pathlib import Path

SERVICES = ("accounting", "refit", "scheduler")
PATCH_DELAY_S = 1.5


def broker_config(passwords: dict[str, str]) -> str:
    users = [f'{{user: "{name}", password: "{secret}"}}' for name, secret in passwords.items()]
    return "authorization {\n  users = [\n    " + ",\n    ".join(users) + "\n  ]\n}\n"


async def watch_readyz(proc: ServiceProcess, seen: list[int]) -> None:
    """Every /readyz status until the process has exited (0: nothing answered)."""
    url = f"http://127.0.0.1:{proc.metrics_port}/readyz"
    timeout = aiohttp.ClientTimeout(total=1)
    assert proc.process is not None
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while proc.process.poll() is None:
            try:
                async with session.get(url) as response:
                    seen.append(response.status)
            except (aiohttp.ClientError, TimeoutError):
                seen.append(0)
            await asyncio.sleep(0.005)  # sampling a probe, not waiting for a condition


async def move_request(nc: Any, snapshot: dict[str, Any], victim: dict[str, Any]) -> Any:
    """accounting's `move` of the victim's container 0 from GPU-a to GPU-b."""
    moved = victim["metadata"]["annotations"][keys.ALLOCATED].replace("GPU-a", "GPU-b")
    body = {
        "node": "node-1",
        "podUID": victim["metadata"]["uid"],
        "revision": snapshot["revision"],
        "containerIndex": 0,
        "toAllocate": moved,
        "allocated": moved,
        "deadlineMs": 3000,
    }
    try:
        return await nc.request(
            subjects.accounting("move", "node-1"), orjson.dumps(body), timeout=5
        )
    except nats.errors.Error as exc:
        return exc  # the answer never comes: accounting's connection is gone


async def test_a_connection_closed_for_good_fails_readiness_and_exits_1(tmp_path: Path) -> None:
    config = tmp_path / "nats.conf"
    passwords = {name: f"{name}-secret" for name in SERVICES} | {"test": "test"}
    config.write_text(broker_config(passwords))
    with NatsServer(config=config) as broker:
        port = broker.port
        url = {name: f"nats://{name}:{passwords[name]}@127.0.0.1:{port}" for name in passwords}
        async with KubeEmulator() as emulator:
            kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
            kube = await kube_for(kubeconfig)
            accounting = service("accounting", url["accounting"], kubeconfig, tmp_path)
            refit = service("refit", url["refit"], kubeconfig, tmp_path)
            sched, _ = scheduler(url["scheduler"], kubeconfig, tmp_path)
            procs = [accounting, refit, sched]
            connection = await natsconn.connect(url["test"], "chaos-test")
            nc = connection.client
            try:
                await create(kube, "node", node("node-1", [gpu("GPU-a", 0), gpu("GPU-b", 1)]))
                victim = await create(kube, "pod", reserved_pod("victim", "GPU-a", 1000, 10))
                accounting.start()
                refit.start()
                await accounting.wait_ready()
                sched.start()
                await refit.wait_ready()
                await sched.wait_ready()

                # One accounting operation in flight: its PATCH is held by the API server.
                held = emulator.faults.add(
                    method="PATCH", path_regex="/pods/victim$", delay_s=PATCH_DELAY_S
                )
                reply = await nc.request(
                    subjects.accounting("snapshot", "node-1"),
                    orjson.dumps({"node": "node-1"}),
                    timeout=5,
                )
                snapshot = orjson.loads(reply.data)
                move = asyncio.ensure_future(move_request(nc, snapshot, victim))
                await wait_for(lambda: held.hits == 1, within=5)

                seen: dict[str, list[int]] = {p.target: [] for p in procs}
                watchers = [asyncio.ensure_future(watch_readyz(p, seen[p.target])) for p in procs]
                await wait_for(lambda: all(200 in statuses for statuses in seen.values()))
                # Revoke the services' credentials; the test client keeps its own.
                revoked = {name: f"revoked-{name}" for name in SERVICES} | {"test": "test"}
                config.write_text(broker_config(revoked))
                assert broker.pid is not None
                os.kill(broker.pid, signal.SIGHUP)  # nats-server reloads its configuration

                codes = {p.target: await p.exit_code(within=20) for p in procs}
                await asyncio.wait_for(asyncio.gather(*watchers), 5)
                move.cancel()  # its answer cannot come: the connection it came in on is gone
                await asyncio.gather(move, return_exceptions=True)
                after = await kube.get_pod("ml", "victim")
            finally:
                await connection.close()
                stop_all(procs)
                await kube.api.close()

    logs = {p.target: p.messages() for p in procs}
    report = "\n".join(
        f"{p.target}: exit {codes[p.target]}, /readyz seen {sorted(set(seen[p.target]))}\n"
        f"{p.tail(8)}"
        for p in procs
    )
    print(
        "\n"
        + "; ".join(f"{n}: exit {codes[n]}, /readyz {tally(map(str, seen[n]))}" for n in SERVICES)
    )
    for name in SERVICES:
        assert codes[name] == 1, report
        assert "nats connection closed for good" in logs[name], report
    # Ready until the revocation; then, while its in-flight move finishes, not ready.
    finished = after["metadata"]["annotations"][keys.ALLOCATED].startswith("GPU-b")
    assert finished, f"accounting abandoned its in-flight move instead of finishing it:\n{report}"
    statuses = seen["accounting"]
    assert 503 in statuses, f"accounting never answered /readyz 503:\n{report}"
    assert 200 not in statuses[statuses.index(503) :], f"ready again after failing:\n{report}"
