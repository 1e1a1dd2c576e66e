"""`numafit run sim-node` against real services: it creates its node, admits pods through its
kubelet emulator and the real device plugin, and refits happen."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from shared.service import natsconn
from shared.tools.simulate.sim_node import build_parser, run, workload
from svc_deviceplugin.config import PluginConfig
from svc_deviceplugin.discovery import SimulatedBackend
from svc_deviceplugin.service import DevicePluginService
from svc_deviceplugin.settings import PluginOptions
from svc_scheduler.service import SchedulerService
from svc_scheduler.settings import SchedulerOptions
from tests.integration.harness import harness
from tests.integration.processes import free_port
from tests.metrics import sample

TOPOLOGY = Path(__file__).resolve().parents[2] / "deploy" / "compose" / "topology.yaml"
ALLOCATIONS = "numafit_deviceplugin_allocations_total"
REFIT_REQUESTS = "numafit_refit_requests_total"


def test_workload_mix_is_deterministic_and_valid() -> None:
    import random

    from shared.core.pods import pod_from_object

    first = [workload(i, random.Random(7), "w") for i in range(1, 6)]
    again = [workload(i, random.Random(7), "w") for i in range(1, 6)]
    assert first == again
    for manifest in first:
        manifest["metadata"]["uid"] = "x"
        assert pod_from_object(manifest).containers


async def test_sim_node_places_pods_through_the_real_services(
    nats_url: str, tmp_path: Path
) -> None:
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="nf-"))
    try:
        async with harness(nats_url, tmp_path, []) as h:
            scheduler = SchedulerService(
                (await natsconn.connect(nats_url, "scheduler")).client,
                await h._kube("s"),
                SchedulerOptions(host="127.0.0.1", port=0),
            )
            await scheduler.start()
            plugin_nc = (await natsconn.connect(nats_url, "plugin")).client
            plugin = DevicePluginService(
                plugin_nc,
                PluginOptions(
                    PluginConfig(node="sim-node-1", directory=directory, watch_interval=0.05),
                    SimulatedBackend.from_file(TOPOLOGY),
                ),
            )
            args = build_parser().parse_args(
                [
                    "--node",
                    "sim-node-1",
                    "--dir",
                    str(directory),
                    "--topology",
                    str(TOPOLOGY),
                    "--kubeconfig",
                    str(h.kubeconfig),
                    "--nats-url",
                    nats_url,
                    "--scheduler-url",
                    scheduler.url,
                    "--interval",
                    "0",
                    "--count",
                    "6",
                    "--max-pods",
                    "4",
                    "--metrics-port",
                    str(free_port()),
                ]
            )
            stop = asyncio.Event()
            sim = asyncio.create_task(run(args, stop))
            # The plugin registers with the sim-node's kubelet once its socket exists.
            await plugin.start()
            try:
                async with asyncio.timeout(60):
                    await sim
            finally:
                await plugin.stop(1.0)
                await plugin_nc.close()
                await scheduler.stop(1.0)
            placed = sample(plugin.metrics.registry, ALLOCATIONS, result="ok")
            assert placed >= 4
            assert h.refit is not None
            moved = sum(
                sample(h.refit.metrics.registry, REFIT_REQUESTS, code="moved", mode=mode)
                for mode in ("best-effort", "strict")
            )
            assert moved >= 1
            # At most --max-pods remain tracked after the deletions.
            snapshot = await h.client.snapshot("sim-node-1")
            assert len(snapshot["nodes"][0]["pods"]) <= 4
    finally:
        shutil.rmtree(directory, ignore_errors=True)
