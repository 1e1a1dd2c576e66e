"""The Kubernetes API client: kubeconfig when given, in-cluster configuration otherwise."""

from __future__ import annotations

from kubernetes_asyncio import client, config


async def api_client(kubeconfig: str | None) -> client.ApiClient:
    if kubeconfig:
        configuration = client.Configuration()
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)
