"""The API client reads the proxy environment once, when it is built, as client-go does, and
no API call waits on a worker thread for it (aiohttp's per-request lookup of the proxy
variables and ~/.netrc took two thread hops per call)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web

from shared.service.kube import api_client
from shared.service.kube_io import Kube

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path


async def _serve(answer: str, seen: list[str]) -> tuple[web.AppRunner, int]:
    async def handle(request: web.Request) -> web.Response:
        seen.append(str(request.url))
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": answer}}
        return web.json_response({**body, "items": []})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port


def _kubeconfig(path: Path, port: int) -> str:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""
    )
    return str(path)


@pytest.fixture
async def servers() -> AsyncIterator[tuple[int, int, list[str], list[str]]]:
    """An API server answering resourceVersion 1 and a forward proxy answering 2."""
    direct: list[str] = []
    proxied: list[str] = []
    api, api_port = await _serve("1", direct)
    proxy, proxy_port = await _serve("2", proxied)
    try:
        yield api_port, proxy_port, direct, proxied
    finally:
        await api.cleanup()
        await proxy.cleanup()


async def _list_version(kubeconfig: str) -> str:
    api = await api_client(kubeconfig)
    try:
        return (await Kube(api, "test").list_pods())[1]
    finally:
        await api.close()


@pytest.mark.parametrize(
    ("no_proxy", "answered_by"), [(None, "proxy"), ("127.0.0.1", "api server")]
)
async def test_the_proxy_of_the_environment_is_used_unless_no_proxy_names_the_host(
    servers: tuple[int, int, list[str], list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_proxy: str | None,
    answered_by: str,
) -> None:
    api_port, proxy_port, direct, proxied = servers
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy_port}")
    monkeypatch.delenv("no_proxy", raising=False)
    if no_proxy is None:
        monkeypatch.delenv("NO_PROXY", raising=False)
    else:
        monkeypatch.setenv("NO_PROXY", no_proxy)
    version = await _list_version(_kubeconfig(tmp_path / "kc", api_port))
    if answered_by == "proxy":
        assert version == "2"
        assert proxied == [f"http://127.0.0.1:{api_port}/api/v1/pods"] and direct == []
    else:
        assert version == "1"
        assert proxied == [] and len(direct) == 1


class _CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


async def test_api_calls_do_not_wait_on_worker_threads(
    servers: tuple[int, int, list[str], list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api_port, _, direct, _ = servers
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    api = await api_client(_kubeconfig(tmp_path / "kc", api_port))
    executor = _CountingExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    try:
        kube = Kube(api, "test")
        for _ in range(5):
            await kube.list_pods()
    finally:
        await api.close()
    assert len(direct) == 5
    assert executor.submitted == 0
