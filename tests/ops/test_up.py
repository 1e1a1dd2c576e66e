"""`numafit up`: the whole system for people and kubectl.

In process: the stack schedules what a user creates through the API as kube-scheduler would
(Scheduled, FailedScheduling with the extender's reasons, kubelet's refusals, release at
deletion). As a process: the banner, real kubectl (`apply`, `wait`, `describe` showing the
refit), and a clean stop on SIGTERM. Every port is a free one, so a running stack never collides.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from shared.core.config import CoreConfig
from shared.service.kube import api_client
from shared.service.kube_io import Kube
from shared.testing.kube_emulator import KubeEmulator
from shared.tools import cli
from shared.tools.local.command import options_from_args
from shared.tools.local.events import EventSink
from shared.tools.local.scheduling_loop import backoff, managed, unschedulable_message
from shared.tools.local.stack import LocalStack, UpOptions
from shared.tools.local.topology import NodeShape, gpus_of, scenario_from_shape
from tests.integration.harness import wait_for

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

ROOT = Path(__file__).resolve().parents[2]
PODS = ROOT / "examples" / "pods"
NUMAFIT = str(Path(sys.executable).with_name("numafit"))
FREE_PORTS = ["--api-port", "0", "--nats-port", "0", "--extender-port", "0"]
FREE_PORTS += ["--metrics-port-base", "0"]


def up_parser() -> argparse.ArgumentParser:
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    up: argparse.ArgumentParser = commands.choices["up"]
    return up


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["up", *argv])


# --- options --------------------------------------------------------------------------------


def test_help_explains_every_option() -> None:
    up = up_parser()
    options = [a for a in up._actions if a.option_strings and a.dest != "help"]
    assert len(options) >= 20
    for action in options:
        assert action.help and len(action.help) > 15, f"{action.option_strings} has no help"
    text = up.format_help()
    for needle in ("9101", "KUBECONFIG", "numafit-scheduler", "Ctrl-C", "kubectl apply"):
        assert needle in text


def test_defaults_are_composes_ports_and_loopback() -> None:
    options = options_from_args(parse())
    assert (options.host, options.api_port, options.nats_port) == ("127.0.0.1", 8080, 4222)
    assert options.extender_port == 8888
    assert [options.metrics_port(i) for i in range(4)] == [9101, 9102, 9103, 9104]
    assert not options.load
    (node,) = options.scenario.nodes
    assert node.name == "gpu-node-1" and node.topology_policy.value == "single-numa-node"
    assert [g.numa for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_gpus_spread_evenly_over_the_numa_nodes() -> None:
    shape = NodeShape(gpus=3, cpus={0: 8, 1: 8, 2: 8})
    assert [(g.uuid, g.numa) for g in gpus_of(2, shape)] == [
        ("GPU-2-0", 0),
        ("GPU-2-1", 1),
        ("GPU-2-2", 2),
    ]
    scenario = scenario_from_shape(NodeShape(nodes=3, gpus=2), CoreConfig())
    assert [n.name for n in scenario.nodes] == ["gpu-node-1", "gpu-node-2", "gpu-node-3"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--nodes", "0"], "--nodes must be between 1 and 64"),
        (["--gpus", "100"], "--gpus must be between 1 and 64"),
        (["--cpus", "0=x"], "--cpus: expected NUMA=COUNT"),
        (["--gpu-memory", "0"], "--gpu-memory must be a positive"),
        (["--load-rate", "0"], "--load-rate must be above 0"),
        (["--load-max-pods", "0"], "--load-max-pods must be at least 1"),
        (["--scrape-interval", "fast"], "--scrape-interval must be a duration"),
        (["--scenario", "/nonexistent.yaml"], "/nonexistent.yaml: cannot read"),
        (
            ["--scenario", str(ROOT / "examples" / "strict-refusal.yaml"), "--gpus", "2"],
            "drop --gpus",
        ),
    ],
)
def test_bad_options_exit_2_with_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["up", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("numafit up: ") and needle in err, err


@pytest.mark.parametrize("argv", [["--api-port", "70000"], ["--nodes", "two"], ["--bogus"]])
def test_malformed_flags_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["up", *argv])
    assert exited.value.code == 2


def test_a_port_in_use_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        argv = ["up", *FREE_PORTS, "--api-port", port, "--state-dir", str(tmp_path)]
        assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"127.0.0.1:{port}, wanted for the Kubernetes API (--api-port), is already in use" in err


# --- the scheduling loop's pieces --------------------------------------------------------------


def test_failed_scheduling_reads_like_kube_schedulers() -> None:
    failed = {"n1": "1/8 CardInsufficientMemory", "n2": "1/8 CardInsufficientMemory", "n3": "x"}
    assert unschedulable_message(3, failed) == (
        "0/3 nodes are available: 2 1/8 CardInsufficientMemory, 1 x."
    )
    assert unschedulable_message(0, {}) == "0/0 nodes are available: no nodes."
    assert [backoff(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_only_pods_naming_a_managed_resource_go_to_the_extender() -> None:
    def pod(resources: dict[str, Any], init: bool = False) -> dict[str, Any]:
        container = {"name": "c", "resources": resources}
        key = "initContainers" if init else "containers"
        return {"spec": {key: [container], **({"containers": []} if init else {})}}

    assert managed(pod({"limits": {"nvidia.com/gpu": 1}}))
    assert managed(pod({"requests": {"nvidia.com/gpumem": 1000}}, init=True))
    assert not managed(pod({"limits": {"cpu": "1"}}))


async def test_repeated_events_fold_into_one_with_a_count(tmp_path: Path) -> None:
    async with KubeEmulator() as emulator:
        api = await api_client(str(emulator.write_kubeconfig(tmp_path / "kubeconfig")))
        try:
            kube = Kube(api, "test")
            sink = EventSink(kube)
            pod = {"metadata": {"namespace": "default", "name": "p", "uid": "u1"}}
            for _ in range(3):
                await sink.record(pod, "Warning", "FailedScheduling", "0/1 nodes", "sched")
            await sink.record(pod, "Warning", "FailedScheduling", "other", "sched")
            events = await events_of(kube, "p")
        finally:
            await api.close()
    counts = sorted((e["message"], e["count"]) for e in events)
    assert counts == [("0/1 nodes", 3), ("other", 1)]
    assert {e["source"]["component"] for e in events} == {"sched"}


# --- the stack, in process -----------------------------------------------------------------------


def manifest(name: str, cpu: int, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.local/w:1",
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": 1,
                            "nvidia.com/gpumem": 10000,
                            "cpu": str(cpu),
                            "memory": "1Gi",
                        }
                    },
                }
            ]
        },
    }


@contextlib.asynccontextmanager
async def local_stack(tmp_path: Path, shape: NodeShape) -> AsyncIterator[tuple[LocalStack, Kube]]:
    options = UpOptions(
        scenario_from_shape(shape, CoreConfig()),
        state_dir=tmp_path / "state",
        api_port=0,
        nats_port=0,
        extender_port=0,
        metrics_port_base=0,
    )
    stack = LocalStack(options)
    try:
        await stack.start()
        api = await api_client(str(stack.kubeconfig))  # a user's client, from the written file
        try:
            yield stack, Kube(api, "user")
        finally:
            await api.close()
    finally:
        await stack.stop()


async def events_of(kube: Kube, name: str) -> list[dict[str, Any]]:
    response: Any = await kube.core.list_namespaced_event(  # raw: _preload_content=False
        "default", field_selector=f"involvedObject.name={name}", _preload_content=False
    )
    try:
        items: list[dict[str, Any]] = json.loads(await response.read())["items"]
    finally:
        response.release()
    return items


async def test_the_stack_schedules_what_users_create(tmp_path: Path) -> None:
    # 8 exclusive CPUs per NUMA node: three 8-CPU pods cannot all be admitted.
    async with local_stack(tmp_path, NodeShape(gpus=4, cpus={0: 8, 1: 8})) as (stack, kube):
        loop = stack.loop
        assert loop is not None
        written = json.loads((stack.state_dir / "stack.json").read_text())
        assert written["kubeconfig"] == str(stack.kubeconfig)
        assert set(written["metrics"]) == {
            "scheduler",
            "accounting",
            "refit",
            "deviceplugin/gpu-node-1",
        }

        # The example pod, as kubectl would send it: the webhook routes it, the loop binds it,
        # kubelet pins its CPUs to NUMA 0 while the GPU reserved is on NUMA 1: refitted.
        example = yaml.safe_load((PODS / "refit-best-effort.yaml").read_text())
        created = await kube.create_pod("default", example)
        assert created["spec"]["schedulerName"] == "numafit-scheduler"
        attempt = await loop.first_attempt(created["metadata"]["uid"])
        assert (attempt.node, attempt.phase) == ("gpu-node-1", "Running")

        async def refit_recorded() -> bool:  # svc_refit records it after its reply
            return any(
                e["reason"] == "NumaRefitSucceed" for e in await events_of(kube, example_name)
            )

        example_name = example["metadata"]["name"]
        await wait_for(refit_recorded, within=10)
        reasons = {e["reason"]: e for e in await events_of(kube, example_name)}
        assert reasons["Scheduled"]["message"] == (
            "Successfully assigned default/refit-best-effort to gpu-node-1"
        )
        assert reasons["Scheduled"]["source"]["component"] == "numafit-scheduler"
        assert reasons["NumaRefitSucceed"]["message"].startswith("NUMA refit moved container 0")
        pod = await kube.get_pod("default", "refit-best-effort")
        assert pod["status"]["phase"] == "Running"
        assert pod["status"]["containerStatuses"][0]["ready"] is True
        allocated = pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
        assert allocated.split(",")[0] in {"GPU-1-0", "GPU-1-1"}  # NUMA 0, beside the CPUs

        # Too big for any GPU: Pending, with kube-scheduler's event and condition.
        big = manifest("too-big", 1)
        big["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = 500000
        created = await kube.create_pod("default", big)
        attempt = await loop.first_attempt(created["metadata"]["uid"])
        assert attempt.node is None
        assert attempt.message == "0/1 nodes are available: 1 4/4 CardInsufficientMemory."
        (event,) = await events_of(kube, "too-big")
        assert (event["type"], event["reason"]) == ("Warning", "FailedScheduling")
        assert event["message"] == attempt.message
        pod = await kube.get_pod("default", "too-big")
        assert pod["status"]["conditions"][0]["reason"] == "Unschedulable"
        assert "default/too-big" in loop.queued()  # retried with backoff
        await kube.delete_pod("default", "too-big")
        await wait_for(lambda: "default/too-big" not in loop.queued(), within=5)

        # 8 CPUs on NUMA 0 (after the example's 4: NUMA 1), then nowhere: kubelet refuses.
        first = await kube.create_pod("default", manifest("eight-a", 8))
        assert (await loop.first_attempt(first["metadata"]["uid"])).phase == "Running"
        refused = await kube.create_pod("default", manifest("eight-b", 8))
        attempt = await loop.first_attempt(refused["metadata"]["uid"])
        assert (attempt.phase, attempt.reason) == ("Failed", "TopologyAffinityError")
        kubelet_events = [
            e for e in await events_of(kube, "eight-b") if e["reason"] == attempt.reason
        ]
        assert kubelet_events and kubelet_events[0]["source"] == {
            "component": "kubelet",
            "host": "gpu-node-1",
        }

        # Deleting a pod frees its CPUs on the node: the same pod now fits.
        await kube.delete_pod("default", "eight-a")
        await kube.delete_pod("default", "eight-b")
        assert stack.cluster.accounting is not None
        ledger = stack.cluster.accounting.ledger
        await wait_for(lambda: ledger.tracked(first["metadata"]["uid"]) is None, within=5)
        again = await kube.create_pod("default", manifest("eight-c", 8))
        attempt = await loop.first_attempt(again["metadata"]["uid"])
        assert attempt.phase == "Running", attempt

        # A pod of the profile that asks for no GPU is bound without the extender.
        plain = manifest("no-gpu", 1)
        plain["spec"]["schedulerName"] = "numafit-scheduler"
        plain["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
        created = await kube.create_pod("default", plain)
        attempt = await loop.first_attempt(created["metadata"]["uid"])
        assert (attempt.node, attempt.phase) == ("gpu-node-1", "Running")
        nats = stack.cluster.nats
    assert nats.pid is None  # nats-server was stopped with the stack


# --- `numafit up` as a process, driven by kubectl ------------------------------------------------


class UpProcess:
    """`numafit up ARGS` with free ports and its own state directory; stopped with SIGTERM."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.state = tmp_path / "state"
        self.log = tmp_path / "up.log"
        with self.log.open("wb") as err:
            self.process = subprocess.Popen(
                [NUMAFIT, "up", *FREE_PORTS, "--state-dir", str(self.state), *args],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.banner: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def close(self) -> None:
        """Kill it if it still runs; close its output."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def wait_ready(self, within: float = 60.0) -> dict[str, Any]:
        """The banner's lines once it is complete; stack.json's content."""
        deadline = time.monotonic() + within
        while not self.banner or "Ctrl-C" not in self.banner[-1]:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"numafit up not ready in {within}s:\n{self.tail()}") from None
            if line is None:
                raise AssertionError(f"numafit up exited {self.process.wait()}:\n{self.tail()}")
            self.banner.append(line.rstrip("\n"))
        stack: dict[str, Any] = json.loads((self.state / "stack.json").read_text())
        return stack

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def stop(self, within: float = 30.0, sig: signal.Signals = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"numafit up did not stop within {within}s:\n{self.tail()}"
            ) from None


@pytest.fixture
def up_process(tmp_path: Path) -> Iterator[list[UpProcess]]:
    started: list[UpProcess] = []
    yield started
    for up in started:
        up.close()


def kubectl(stack: dict[str, Any], *args: str, check: bool = True) -> str:
    result = subprocess.run(
        ["kubectl", *args],
        env={**os.environ, "KUBECONFIG": stack["kubeconfig"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check:
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout + result.stderr


def port_closed(url: str) -> bool:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) != 0


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_apply_then_describe_shows_the_refit(
    tmp_path: Path, up_process: list[UpProcess]
) -> None:
    up = UpProcess(tmp_path)
    up_process.append(up)
    stack = up.wait_ready()
    banner = "\n".join(up.banner)
    assert f"export KUBECONFIG={stack['kubeconfig']}" in banner
    for url in (stack["api"], stack["nats"], stack["extender"], *stack["metrics"].values()):
        assert url in banner and "127.0.0.1" in url

    pod = str(PODS / "refit-best-effort.yaml")
    kubectl(stack, "apply", "-f", pod)  # validated against the emulator's OpenAPI
    kubectl(
        stack,
        "wait",
        "--for=jsonpath={.status.phase}=Running",
        "pod/refit-best-effort",
        "--timeout=30s",
    )
    described = kubectl(stack, "describe", "pod", "refit-best-effort")
    assert "NumaRefitSucceed" in described and "NUMA refit moved container 0" in described
    assert "Successfully assigned default/refit-best-effort to gpu-node-1" in described

    assert up.stop() == 0, up.tail()
    assert "numafit is down" in up.log.read_text()
    for url in (stack["api"], stack["nats"], stack["extender"], *stack["metrics"].values()):
        assert port_closed(url.removesuffix("/metrics")), f"{url} still answers"


async def test_a_scenarios_pods_are_created_once_the_stack_is_up(tmp_path: Path) -> None:
    from shared.tools.simulate.scenario import load_scenario

    scenario = load_scenario(ROOT / "examples" / "single-numa-node-mismatch.yaml")
    options = UpOptions(
        scenario,
        state_dir=tmp_path / "state",
        api_port=0,
        nats_port=0,
        extender_port=0,
        metrics_port_base=0,
    )
    stack = LocalStack(options)
    try:
        await stack.start()
        assert stack.cluster.kube is not None
        pod = await stack.cluster.kube.get_pod("demo", "aligned")
        assert pod["spec"]["nodeName"] == "node-1" and pod["status"]["phase"] == "Running"
        allocated = pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
        assert allocated.startswith("GPU-a,")  # refitted onto the GPU beside its CPUs
    finally:
        await stack.stop()
