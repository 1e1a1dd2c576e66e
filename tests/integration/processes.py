"""Helpers for tests that run numafit components as processes, as an operator would."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import aiohttp

from tests.integration.harness import wait_for

NUMAFIT = str(Path(sys.executable).with_name("numafit"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def spawn(
    processes: list[subprocess.Popen[bytes]], *args: str, log: Path
) -> subprocess.Popen[bytes]:
    """`numafit run ARGS...` with its output in `log`."""
    with log.open("wb") as handle:  # the child keeps its own descriptor
        process = subprocess.Popen([NUMAFIT, "run", *args], stdout=handle, stderr=subprocess.STDOUT)
    processes.append(process)
    return process


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def ready(port: int) -> bool:
    try:
        status, _ = await get(f"http://127.0.0.1:{port}/readyz")
    except aiohttp.ClientError:
        return False
    return status == 200


async def kube_emulator_process(processes: list[subprocess.Popen[bytes]], tmp_path: Path) -> Path:
    """A `numafit run kube-emulator` process on a free port; returns its kubeconfig."""
    kubeconfig = tmp_path / "kubeconfig"
    spawn(
        processes,
        "kube-emulator",
        "--port",
        "0",
        "--kubeconfig-out",
        str(kubeconfig),
        log=tmp_path / "kube.log",
    )
    await wait_for(kubeconfig.exists, within=20)
    return kubeconfig
