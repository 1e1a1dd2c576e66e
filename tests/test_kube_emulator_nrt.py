"""NodeResourceTopology (topology.node.k8s.io/v1alpha2) served like any other resource, through
kubernetes_asyncio's CustomObjectsApi as a producer or consumer of these objects would use it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client import ApiClient, ApiException, Configuration, CustomObjectsApi

from shared.testing.kube_emulator import KubeEmulator

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

GROUP, VERSION, PLURAL = "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies"
WAIT_S = 5.0


@pytest.fixture
async def emulator() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as running:
        yield running


@pytest.fixture
async def api(emulator: KubeEmulator, tmp_path: Path) -> AsyncIterator[ApiClient]:
    path = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    configuration = Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    async with ApiClient(configuration=configuration) as connected:
        yield connected


def topology(node: str, available: str = "2") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NodeResourceTopology",
        "metadata": {"name": node},
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "container"},
        ],
        "zones": [
            {
                "name": "node-0",
                "type": "Node",
                "costs": [{"name": "node-0", "value": 10}, {"name": "node-1", "value": 20}],
                "resources": [
                    {
                        "name": "nvidia.com/gpu",
                        "capacity": "4",
                        "allocatable": "4",
                        "available": available,
                    }
                ],
            }
        ],
    }


async def merge_patch(objects: CustomObjectsApi, name: str, patch: dict[str, Any]) -> Any:
    """A JSON merge patch (the client's default for custom objects is a JSON patch)."""
    # The stubs lack _content_type, which the client accepts and sends as Content-Type.
    return await objects.patch_cluster_custom_object(  # type: ignore[call-arg]
        GROUP, VERSION, PLURAL, name, patch, _content_type="application/merge-patch+json"
    )


async def test_discovery_lists_the_resource(api: ApiClient) -> None:
    groups = await client.ApisApi(api).get_api_versions()
    resources = await CustomObjectsApi(api).get_api_resources(GROUP, VERSION)

    (group,) = [g for g in groups.groups if g.name == GROUP]
    assert [v.version for v in group.versions] == [VERSION]
    (resource,) = [r for r in resources.resources if r.name == PLURAL]
    assert resource.kind == "NodeResourceTopology"
    assert resource.namespaced is False
    assert resource.singular_name == "noderesourcetopology"
    assert {"create", "get", "list", "watch", "update", "patch", "delete"} <= set(resource.verbs)


async def test_create_get_list_update_patch_delete(api: ApiClient) -> None:
    objects = CustomObjectsApi(api)

    created = await objects.create_cluster_custom_object(GROUP, VERSION, PLURAL, topology("n1"))
    await objects.create_cluster_custom_object(GROUP, VERSION, PLURAL, topology("n2"))
    fetched = await objects.get_cluster_custom_object(GROUP, VERSION, PLURAL, "n1")
    listed = await objects.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    selected = await objects.list_cluster_custom_object(
        GROUP, VERSION, PLURAL, field_selector="metadata.name=n2"
    )
    fetched["zones"][0]["resources"][0]["available"] = "1"
    replaced = await objects.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "n1", fetched)
    patched = await merge_patch(objects, "n1", {"metadata": {"labels": {"updated": "yes"}}})
    await objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "n2")
    remaining = await objects.list_cluster_custom_object(GROUP, VERSION, PLURAL)

    assert created["metadata"]["uid"]
    assert "namespace" not in created["metadata"]
    assert fetched["zones"][0]["costs"] == [
        {"name": "node-0", "value": 10},
        {"name": "node-1", "value": 20},
    ]
    assert listed["kind"] == "NodeResourceTopologyList"
    assert [item["metadata"]["name"] for item in listed["items"]] == ["n1", "n2"]
    assert [item["metadata"]["name"] for item in selected["items"]] == ["n2"]
    assert replaced["zones"][0]["resources"][0]["available"] == "1"
    assert int(replaced["metadata"]["resourceVersion"]) > int(
        created["metadata"]["resourceVersion"]
    )
    assert patched["metadata"]["labels"] == {"updated": "yes"}
    assert patched["attributes"] == topology("n1")["attributes"]
    assert [item["metadata"]["name"] for item in remaining["items"]] == ["n1"]


async def test_a_watch_sees_changes_in_order(api: ApiClient) -> None:
    objects = CustomObjectsApi(api)
    listed = await objects.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    await objects.create_cluster_custom_object(GROUP, VERSION, PLURAL, topology("n1"))
    await merge_patch(objects, "n1", {"metadata": {"labels": {"x": "y"}}})
    await objects.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "n1")

    seen = []
    async with watch.Watch() as stream, asyncio.timeout(WAIT_S):
        async for event in stream.stream(
            objects.list_cluster_custom_object,
            GROUP,
            VERSION,
            PLURAL,
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=10,
        ):
            seen.append((event["type"], event["object"]["metadata"].get("labels")))
            if len(seen) == 3:
                break

    assert seen == [("ADDED", None), ("MODIFIED", {"x": "y"}), ("DELETED", {"x": "y"})]


async def test_it_is_cluster_scoped_and_validated(api: ApiClient) -> None:
    objects = CustomObjectsApi(api)
    invalid = topology("n1")
    invalid["zones"][0]["resources"][0]["capacity"] = ["4"]

    with pytest.raises(ApiException) as namespaced:
        await objects.create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, topology("n1")
        )
    with pytest.raises(ApiException) as refused:
        await objects.create_cluster_custom_object(GROUP, VERSION, PLURAL, invalid)

    assert namespaced.value.status == 404
    assert refused.value.status == 422
