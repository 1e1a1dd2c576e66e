"""`numafit run sim-node` and NodeResourceTopology: the refit outcome it logs per container is
the real one (judged from kubelet's side of the exchange), and with
`--node-resource-topology` it publishes the node's object for the scheduler to predict from."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from pathlib import Path

import pytest

from shared.core.nrt import parse_nrt
from shared.core.pods import Alignment
from shared.service import natsconn
from shared.service.kube_topology import TopologyApi
from shared.testing.kubelet_emulator import TopologyAffinityError, UnexpectedAdmissionError
from shared.tools.simulate.driver import Observed, observed_refit
from shared.tools.simulate.sim_node import build_parser, run
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
BE, STRICT = Alignment.BEST_EFFORT, Alignment.STRICT
REFUSED = UnexpectedAdmissionError("rpc error: code = FailedPrecondition desc = numa-alignment")


@pytest.mark.parametrize(
    ("seen", "outcome"),
    [
        (Observed(("GPU-1",), ("GPU-1",), True, BE), "none"),  # the reservation was offered
        (Observed(("GPU-5",), ("GPU-1",), True, BE), "moved"),  # the plugin chose the refit's
        (Observed(("GPU-5",), ("GPU-0",), False, BE), "fallback"),  # left to kubelet
        (Observed(("GPU-5",), ("GPU-0",), False, None), "none"),  # not opted in: no refit
        (Observed(("GPU-5",), (), False, STRICT, REFUSED), "strict_failed"),
        (Observed(("GPU-5",), (), False, STRICT, TopologyAffinityError()), "none"),
        (Observed((), (), False, None), "none"),  # no GPU
    ],
)
def test_the_refit_outcome_as_kubelet_saw_it(seen: Observed, outcome: str) -> None:
    assert observed_refit(seen) == outcome


@pytest.mark.parametrize("nrt", [False, True], ids=["plain", "node-resource-topology"])
async def test_sim_node_logs_real_refits_and_publishes_node_resource_topology(
    nats_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, nrt: bool
) -> None:
    caplog.set_level(logging.INFO, logger="numafit.sim-node")
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="nf-"))
    try:
        async with harness(nats_url, tmp_path, []) as h:
            kube = await h._kube("s")
            scheduler = SchedulerService(
                (await natsconn.connect(nats_url, "scheduler")).client,
                kube,
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
            common = ["--node", "sim-node-1", "--dir", str(directory), "--topology", str(TOPOLOGY)]
            args = build_parser().parse_args(
                [
                    *common,
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
                    "6",
                    "--metrics-port",
                    str(free_port()),
                    "--node-resource-topology" if nrt else "--no-node-resource-topology",
                ]
            )
            sim = asyncio.create_task(run(args, asyncio.Event()))
            await plugin.start()
            try:
                async with asyncio.timeout(60):
                    await sim
                objects, _ = await TopologyApi(kube).list()
            finally:
                await plugin.stop(1.0)
                await plugin_nc.close()
                await scheduler.stop(1.0)
            logged = [
                outcome
                for record in caplog.records
                if record.getMessage() == "pod placed"
                for outcome in record.__dict__["refit"]
            ]
            assert len(logged) >= 6
            registry = plugin.metrics.registry

            def refits(result: str, *modes: str) -> float:
                name = "numafit_deviceplugin_refits_total"
                return sum(sample(registry, name, mode=m, result=result) for m in modes)

            # What sim-node logs is what the device plugin (another process in compose) did.
            assert logged.count("moved") == refits("moved", "best-effort", "strict")
            assert logged.count("strict_failed") == refits("strict_failed", "strict")
            left_to_kubelet = refits("fallback", "best-effort") + refits("timeout", "best-effort")
            assert logged.count("fallback") == left_to_kubelet
            predictions = {
                r: sample(
                    scheduler.metrics.registry, "numafit_scheduler_numa_predictions_total", result=r
                )
                for r in ("hit", "miss", "none")
            }
            if not nrt:
                assert objects == []
                assert logged.count("moved") >= 1  # refits happen without predictions
                assert predictions["hit"] == predictions["miss"] == 0
                return
            (published,) = [parse_nrt(o) for o in objects]
            assert published.node == "sim-node-1" and published.sampled_at is not None
            assert set(published.free_cpus) == {0, 1}
            assert predictions["none"] == 0 and predictions["hit"] >= 1  # all predicted
    finally:
        shutil.rmtree(directory, ignore_errors=True)
