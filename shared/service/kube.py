"""The Kubernetes API client: kubeconfig when given, in-cluster configuration otherwise.

A kubeconfig that cannot be used is named in the error (`KubeconfigError`): the path, and why
(not there, not readable, not a kubeconfig), so `--kubeconfig` or `KUBECONFIG` can be fixed
from the one line a service prints before it exits.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes_asyncio import client, config


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
    return client.ApiClient(configuration)


def _readable(path: Path) -> Path:
    """`path`, once it is known to be a file this process can read (a kubeconfig is small)."""
    try:
        path.read_bytes()
    except OSError as exc:
        raise KubeconfigError(f"cannot read kubeconfig {path}: {exc.strerror or exc}") from exc
    return path
