"""compose.yaml is safe by default and healthy: every published port listens on 127.0.0.1
unless the operator says otherwise, every numafit service has a readiness healthcheck that runs
with what the image has (and really tells ready from not ready), and services wait for what
they need to be ready first, without waiting on each other in a circle."""

from __future__ import annotations

import asyncio
import re
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from shared.service.health import HealthServer, Readiness
from tests.ops.test_compose_and_monitoring import parsers

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
PUBLISH = "NUMAFIT_PUBLISH_ADDRESS"
"""The variable that publishes compose's ports on another address, on purpose."""


def interpolate(text: str, environment: dict[str, str]) -> str:
    """Compose's variable interpolation for the forms compose.yaml uses: `${NAME}`,
    `${NAME:-default}` (default when unset or empty), `${NAME-default}` (when unset), `$$`.
    Any other `$` is refused, so that a form this does not read cannot pass unnoticed."""

    def value(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, default = match.group("name"), match.group("op"), match.group("default")
        got = environment.get(name)
        if op == ":-":
            return got or default
        if op == "-":
            return default if got is None else got
        return got or ""

    pattern = r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?-)(?P<default>[^}]*))?\}"
    resolved = re.sub(pattern, value, text)
    leftover = re.sub(pattern, "", text)
    assert "$" not in leftover, f"unsupported interpolation in {text!r}"
    return resolved


def compose(environment: dict[str, str] | None = None) -> dict[str, Any]:
    """compose.yaml as `docker compose config` reads it with `environment` (none by default)."""
    text = interpolate(COMPOSE.read_text(), environment or {})
    document: dict[str, Any] = yaml.safe_load(text)
    return document


def published(service: dict[str, Any]) -> list[tuple[str, int]]:
    """(host address, host port) of every port the service publishes; "" is every interface."""
    found = []
    for port in service.get("ports", []):
        if isinstance(port, dict):  # the long syntax
            found.append((str(port.get("host_ip", "")), int(port["published"])))
            continue
        spec = str(port).split("/", 1)[0]
        if spec.startswith("["):  # [::1]:8080:8080
            host, _, rest = spec[1:].partition("]:")
            found.append((host, int(rest.split(":")[0])))
            continue
        parts = spec.split(":")
        if len(parts) == 3:
            found.append((parts[0], int(parts[1])))
        elif len(parts) == 2:
            found.append(("", int(parts[0])))
        else:  # a container port alone: a random host port on every interface
            found.append(("", 0))
    return found


def test_the_interpolation_reads_compose_forms() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d} ${EMPTY:-d} ${UNSET:-d} ${EMPTY-d} ${UNSET-d} $$", env) == (
        "x d d  d $"
    )
    with pytest.raises(AssertionError):
        interpolate("$SET", env)


def test_the_port_reader_reads_every_syntax() -> None:
    service = {
        "ports": [
            "127.0.0.1:1:2",
            "3:4",
            "5",
            "[::1]:6:7/udp",
            {"target": 8, "published": 9, "host_ip": "127.0.0.1"},
            {"target": 10, "published": 11},
        ]
    }
    assert published(service) == [
        ("127.0.0.1", 1),
        ("", 3),
        ("", 0),
        ("::1", 6),
        ("127.0.0.1", 9),
        ("", 11),
    ]


def test_every_published_port_listens_on_loopback_only() -> None:
    services = compose()["services"]
    ports = {name: published(s) for name, s in services.items()}
    assert {p for found in ports.values() for _, p in found} == {
        4222,  # NATS, unauthenticated here
        8222,  # NATS monitoring
        8080,  # the API emulator, unauthenticated
        8888,  # the extender and webhook
        9090,  # Prometheus
        3000,  # Grafana, anonymous Admin
    }
    for name, found in ports.items():
        for host, port in found:
            assert host == "127.0.0.1", f"{name} publishes {port} on {host or 'every interface'}"
    assert not [n for n, s in services.items() if s.get("network_mode") == "host"]


def test_one_variable_publishes_every_port_elsewhere_on_purpose() -> None:
    services = compose({PUBLISH: "0.0.0.0"})["services"]
    hosts = {host for s in services.values() for host, _ in published(s)}
    assert hosts == {"0.0.0.0"}


def numafit_services() -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose()["services"].items()
        if str(service.get("image", "")).startswith("numafit/")
    }


def readiness_port(service: dict[str, Any]) -> int:
    """The port of the service's /readyz: the API emulator's own, the others' metrics port."""
    target, *flags = service["command"]
    parsed = parsers()[target]().parse_args(flags)
    port: int = parsed.port if target == "kube-emulator" else parsed.metrics_port
    return port


def image_tools() -> set[str]:
    """Executables on the image's PATH that a healthcheck may call: the final stage's Python
    (the base is a python image) and what the numafit virtualenv, first on PATH, installs."""
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M)
    assert base is not None and base.group(1).startswith("python:")
    final = text.rsplit("\nFROM ", 1)[1]
    assert final.startswith("${PYTHON_IMAGE}")
    path = re.search(r"^ENV PATH=(\S+)", final, re.M)
    assert path is not None and path.group(1).startswith("/opt/numafit/bin:")
    assert "--without-pip /opt/numafit" in text  # no pip in it: nothing to call there
    return {"python", "python3", "numafit", "nats-server"}


def probe(service: dict[str, Any]) -> tuple[list[str], str]:
    """The healthcheck's command (without CMD) and the URL it probes."""
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD", "exec form: no shell needed in the image"
    command = list(test[1:])
    urls = [a for a in command if a.startswith("http://")]
    assert len(urls) == 1, command
    return command, urls[0]


def test_every_numafit_service_has_a_readiness_healthcheck_the_image_can_run() -> None:
    services = numafit_services()
    assert set(services) >= {
        "kube-emulator",
        "accounting-1",
        "accounting-2",
        "refit",
        "scheduler",
        "deviceplugin",
        "sim-node",
    }
    tools = image_tools()
    for name, service in services.items():
        assert "healthcheck" in service, f"{name} has no healthcheck"
        command, url = probe(service)
        assert command[0] in tools, f"{name}: {command[0]} is not in the image"
        parsed = urllib.parse.urlsplit(url)
        assert parsed.hostname == "127.0.0.1", f"{name}: probes {url}, not itself"
        assert parsed.port == readiness_port(service), f"{name}: {url} is not its port"
        assert parsed.path == "/readyz", f"{name}: {url} is not readiness"
        check = service["healthcheck"]
        assert {"interval", "timeout", "retries", "start_period"} <= set(check), name
        within = re.search(r"timeout=(\d+)", " ".join(command))
        assert within is not None, f"{name}: the probe has no timeout of its own"
        assert int(within.group(1)) < int(check["timeout"].removesuffix("s")), name


def test_nats_is_probed_with_the_tool_its_image_has() -> None:
    nats = compose()["services"]["nats"]
    # The scratch-based nats image has no tool at all; the alpine one has busybox's wget.
    assert nats["image"].endswith("-alpine")
    command, url = probe(nats)
    assert command[0] == "wget"
    monitoring = int(nats["command"][nats["command"].index("-m") + 1])
    assert url == f"http://127.0.0.1:{monitoring}/healthz"


async def run_probe(command: list[str], port: int) -> int:
    """The healthcheck's command, with this test's Python and the server's port."""
    args = [sys.executable if command[0] == "python" else command[0], *command[1:]]
    args = [re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", a) for a in args]
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    async with asyncio.timeout(30):
        return await process.wait()


async def test_the_probe_passes_only_while_the_service_is_ready() -> None:
    command, _ = probe(numafit_services()["accounting-1"])
    probes = {tuple(probe(s)[0][:-1]) for s in numafit_services().values()}
    assert probes == {tuple(command[:-1])}, "every numafit service uses the one probe"
    readiness = Readiness("ledger", "nats")
    server = HealthServer(CollectorRegistry(), readiness, "127.0.0.1", 0)
    await server.start()
    try:
        assert await run_probe(command, server.port) != 0  # 503: not ready
        readiness.set("ledger")
        readiness.set("nats")
        assert await run_probe(command, server.port) == 0
        readiness.draining = True  # stopping: not ready again
        assert await run_probe(command, server.port) != 0
    finally:
        await server.stop()
    assert await run_probe(command, server.port) != 0  # nothing listening


def depends(service: dict[str, Any]) -> dict[str, str]:
    """The service's dependencies and the condition each waits for."""
    found = service.get("depends_on", {})
    if isinstance(found, list):
        return dict.fromkeys(found, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in found.items()}


def test_services_wait_for_what_they_need_to_be_ready() -> None:
    services = compose()["services"]
    accounting = [n for n, s in services.items() if s.get("command", [""])[0] == "accounting"]
    assert len(accounting) == 2
    for name, service in numafit_services().items():
        waits = depends(service)
        for other, condition in waits.items():
            if condition == "service_healthy":
                assert "healthcheck" in services[other], f"{name} waits on {other}, unprobed"
        environment = service.get("environment", {})
        if "NUMAFIT_NATS_URL" in environment:
            assert waits.get("nats") == "service_healthy", name
        if "KUBECONFIG" in environment:  # written by the API emulator once it is up
            assert waits.get("kube-emulator") == "service_healthy", name
    # The scheduler is ready once accounting's first snapshot landed; the device plugin
    # registers its inventory through accounting and asks refit at admission.
    for name in accounting:
        assert depends(services["scheduler"])[name] == "service_healthy"
        assert depends(services["deviceplugin"])[name] == "service_healthy"
    assert depends(services["deviceplugin"])["refit"] == "service_healthy"
    # sim-node schedules through the extender; the device plugin becomes ready only by
    # registering with sim-node's kubelet, so sim-node must not wait for it to be healthy.
    sim = services["sim-node"]
    url = sim["command"][sim["command"].index("--scheduler-url") + 1]
    assert depends(sim)[str(urllib.parse.urlsplit(url).hostname)] == "service_healthy"
    assert depends(sim)["deviceplugin"] == "service_started"


def test_no_service_waits_on_itself() -> None:
    services = compose()["services"]
    graph = {name: set(depends(s)) for name, s in services.items()}
    assert all(d in services for deps in graph.values() for d in deps)
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"depends_on cycle: {' -> '.join((*path, name))}"
        if name in done:
            return
        for other in graph[name]:
            visit(other, (*path, name))
        done.add(name)

    for name in graph:
        visit(name, ())


def test_the_image_exposes_every_port_compose_listens_on() -> None:
    exposed = re.search(r"^EXPOSE (.+)$", DOCKERFILE.read_text(), re.M)
    assert exposed is not None
    ports = {int(p) for p in exposed.group(1).split()}
    listening: set[int] = set()
    for service in numafit_services().values():
        target, *flags = service["command"]
        parsed = parsers()[target]().parse_args(flags)
        listening.add(readiness_port(service))
        if target == "scheduler":
            listening.add(parsed.listen_port)  # the extender and webhook
    assert listening == ports
