"""The Kubernetes API client: kubeconfig when given, in-cluster configuration otherwise.

A kubeconfig that cannot be used is named in the error (`KubeconfigError`): the path, and why
(not there, not readable, not a kubeconfig), so `--kubeconfig` or `KUBECONFIG` can be fixed
from the one line a service prints before it exits.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import yaml
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client, config
from yarl import URL


class KubeconfigError(RuntimeError):
    """The Kubernetes client configuration cannot be loaded (the message says which and why)."""


async def api_client(kubeconfig: str | None) -> client.ApiClient:
    configuration = client.Configuration()
    if kubeconfig:
        path = _readable(Path(kubeconfig))
        try:
            await config.load_kube_config(config_file=str(path), client_configuration=configuration)
        except (config.ConfigException, yaml.YAMLError, ValueError, TypeError) as exc:
            why = " ".join(str(exc).split())  # YAML errors span lines: one line for the log
            raise KubeconfigError(f"kubeconfig {path} is not usable: {why}") from exc
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException as exc:
            raise KubeconfigError(
                f"no kubeconfig given (--kubeconfig or KUBECONFIG) and no in-cluster "
                f"configuration: {exc}"
            ) from exc
    api = client.ApiClient(configuration)
    _environment_read_once(api, configuration)
    return api


def _environment_read_once(api: client.ApiClient, configuration: client.Configuration) -> None:
    """kubernetes_asyncio's HTTP session trusts the environment, so aiohttp looks up the proxy
    variables and ~/.netrc in a worker thread on every request: two thread hops (and a netrc
    read) per API call, a third of a bare PATCH's time here. The environment of a running
    process does not change: the proxy that applies to the API server is looked up once, here,
    as client-go does, and the per-request lookup is turned off. (client-go never reads
    ~/.netrc: credentials come from the kubeconfig or the service account.)"""
    rest = api.rest_client
    if not configuration.proxy:
        with contextlib.suppress(LookupError, ValueError):
            proxy, auth = get_env_proxy_for_url(URL(configuration.host or ""))
            rest.proxy = str(proxy)
            if auth is not None:
                rest.proxy_headers = {
                    **(rest.proxy_headers or {}),
                    "Proxy-Authorization": auth.encode(),
                }
    rest.pool_manager._trust_env = False


def _readable(path: Path) -> Path:
    """`path`, once it is known to be a file this process can read (a kubeconfig is small)."""
    try:
        path.read_bytes()
    except OSError as exc:
        raise KubeconfigError(f"cannot read kubeconfig {path}: {exc.strerror or exc}") from exc
    return path
