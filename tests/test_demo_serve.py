"""`numafit demo --serve`: the report first, then every service's /metrics on 127.0.0.1 at
compose's and `numafit up`'s ports, each printed as it is listened on, and a pointer to
`numafit up` for a stack kubectl can create pods in."""

from __future__ import annotations

import asyncio
import io
import re
import socket
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from shared.tools import cli
from shared.tools.local import defaults
from shared.tools.simulate.report import simulate
from shared.tools.simulate.scenario import parse_scenario

if TYPE_CHECKING:
    from shared.tools.simulate.cluster import SimCluster

SCENARIO = """
nodes:
  - name: node-1
    topologyPolicy: none
    gpus:
      - {uuid: GPU-a, model: NVIDIA H100, memory: 81920, numa: 0}
pods:
  - metadata: {name: one, namespace: demo}
    spec:
      containers:
        - name: app
          image: busybox
          resources:
            limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 1000}
"""


class Announced(io.StringIO):
    """Standard error that says when the endpoints have all been printed."""

    def __init__(self) -> None:
        super().__init__()
        self.serving = asyncio.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if "Ctrl-C to stop" in text:
            self.serving.set()
        return written


async def test_metrics_are_served_on_loopback_in_composes_order_after_the_report() -> None:
    err, stop = Announced(), asyncio.Event()
    serve = cli.serve_metrics(err, base=0, stop=stop, source="demo.yaml")
    steps: list[str] = []
    fetched: dict[str, tuple[str, int, str]] = {}

    async def keep(cluster: SimCluster) -> None:
        steps.append("serving")
        task = asyncio.create_task(serve(cluster))
        waiting = asyncio.create_task(err.serving.wait())
        await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), err.getvalue()  # it serves until told to stop
        async with aiohttp.ClientSession() as session:
            for name, url in re.findall(r"^  (\S+)\s+(http://\S+/metrics)$", err.getvalue(), re.M):
                async with session.get(url) as response:
                    fetched[name] = (url, response.status, await response.text())
        stop.set()
        await task

    def ready(report: dict[str, Any]) -> None:
        steps.append("report")

    await simulate(parse_scenario(SCENARIO), keep=keep, ready=ready)
    assert steps == ["report", "serving"]  # the table is printed before the wait, not after
    assert list(fetched) == ["scheduler", "accounting", "refit", "deviceplugin/node-1"]
    for url, status, _ in fetched.values():
        assert url.startswith("http://127.0.0.1:") and status == 200
    assert "numafit_accounting_device_memory_overcommitted_mib" in fetched["accounting"][2]
    assert "numafit_deviceplugin_fallback_containers" in fetched["deviceplugin/node-1"][2]
    assert "run `numafit up --scenario demo.yaml`" in err.getvalue()


def test_the_ports_are_composes() -> None:
    # scheduler 9101, accounting 9102, refit 9103, device plugin 9104, as compose.yaml has.
    assert defaults.METRICS_PORT_BASE == 9101
    assert defaults.SERVICES == ("scheduler", "accounting", "refit")
    assert defaults.HOST == "127.0.0.1"


def test_a_taken_port_is_named_before_anything_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(defaults.StackError) as caught:
            cli.check_demo_ports("127.0.0.1", port, nodes=1)  # the scheduler's port
    assert str(caught.value).startswith(
        f"127.0.0.1:{port}, wanted for scheduler metrics, is already in use"
    )
