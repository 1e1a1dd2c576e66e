"""The image, built for real where a Docker engine answers (testcontainers' docker client):
`numafit run accounting --help` runs in it, as the unprivileged user with a real home, from a
virtualenv without pip or setuptools, and the build does not warn about the user. Without an
engine (CI here) the module is skipped with one line."""

from __future__ import annotations

import gc
import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import pytest

from shared.testing.nats_server import environment_has_docker

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[2]
TAG = "numafit/numafit:pytest"
BUILD_TIMEOUT = 900
"""Seconds for the build (the wheels come from PyPI) and each run."""


def engine() -> docker.DockerClient | None:
    """A client of the engine that answers, or None. Asked only where an engine is configured
    (as the NATS fixture decides); docker's client leaves its socket open when the engine
    does not answer, so that socket is collected here, its warning ignored."""
    if not environment_has_docker():
        return None
    client: docker.DockerClient | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client = docker.from_env(timeout=BUILD_TIMEOUT)
            client.ping()
        except docker.errors.DockerException:
            if client is not None:
                client.close()
            client = None
        gc.collect()
    return client


CLIENT = engine()
if CLIENT is None:
    # One line for the whole module, not one per test.
    pytest.skip("no Docker engine: the image is not built here", allow_module_level=True)


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[docker.DockerClient, list[str]]]:
    """The image built from the checkout, and the build's output lines."""
    assert CLIENT is not None
    _, logs = CLIENT.images.build(path=str(ROOT), tag=TAG, rm=True, forcerm=True)
    lines = [str(entry.get("stream", "")) for entry in logs if isinstance(entry, dict)]
    try:
        yield CLIENT, lines
    finally:
        CLIENT.images.remove(TAG, force=True)
        CLIENT.close()


def run(client: docker.DockerClient, command: list[str], **options: Any) -> str:
    output = client.containers.run(TAG, command, remove=True, stdout=True, stderr=True, **options)
    assert isinstance(output, bytes)
    return output.decode()


def test_numafit_run_accounting_help_runs_in_the_image(
    image: tuple[docker.DockerClient, list[str]],
) -> None:
    client, _ = image
    out = run(client, ["accounting", "--help"])  # the entrypoint is `numafit run`
    assert out.startswith("usage: numafit run accounting")
    assert "--nats-url" in out


HYGIENE = """
import importlib.util, json, os, shutil, sys
home = os.environ.get("HOME", "")
print(json.dumps({
    "uid": os.getuid(),
    "home": home,
    "home_is_dir": os.path.isdir(home),
    "prefix": sys.prefix,
    "installers": [m for m in ("pip", "setuptools", "wheel") if importlib.util.find_spec(m)],
    "pip_on_path": shutil.which("pip") or shutil.which("pip3"),
}))
"""


def test_the_runtime_is_unprivileged_and_cannot_install(
    image: tuple[docker.DockerClient, list[str]],
) -> None:
    client, build_log = image
    facts = json.loads(run(client, ["-c", HYGIENE], entrypoint=["python"]))
    assert facts == {
        "uid": 10001,
        "home": "/home/numafit",
        "home_is_dir": True,
        "prefix": "/opt/numafit",
        "installers": [],
        "pip_on_path": None,
    }
    assert not [line for line in build_log if "useradd warning" in line]
