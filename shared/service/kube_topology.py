"""NodeResourceTopology calls (topology.node.k8s.io/v1alpha2, cluster-scoped) over the same
ApiClient and error translation as `kube_io`: list and watch for the scheduler, publish for
the emulated topology-updater.

Publishing is a JSON merge patch of the whole object (a merge patch replaces lists, so the
zones and attributes are exactly the new ones, and no resourceVersion is needed, as for the
topology-updater's own updates); a node that has none yet gets it created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubernetes_asyncio import client

from shared.core import nrt
from shared.service.kube_io import MERGE_PATCH, Conflict, NotFound, _call, watch_list

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from shared.service.kube_io import Kube

WHAT = "noderesourcetopologies"


class TopologyApi:
    """The NodeResourceTopology calls numafit makes, over one `Kube`'s ApiClient."""

    def __init__(self, kube: Kube) -> None:
        self.custom = client.CustomObjectsApi(kube.api)

    async def list(self) -> tuple[list[dict[str, Any]], str]:
        """Every object and the list's resourceVersion (to watch from)."""
        body = await _call(
            lambda: self.custom.list_cluster_custom_object(
                nrt.GROUP, nrt.VERSION, nrt.PLURAL, _preload_content=False
            ),
            f"list {WHAT}",
        )
        items = body.get("items") if isinstance(body, dict) else None
        meta = body.get("metadata") if isinstance(body, dict) else None
        version = meta.get("resourceVersion", "") if isinstance(meta, dict) else ""
        return (items if isinstance(items, list) else []), str(version or "")

    async def watch(
        self, resource_version: str, timeout_seconds: int = 300
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Raw watch events (type, object) from `resource_version`; `Gone` on 410."""
        lister = self.custom.list_cluster_custom_object
        args = (nrt.GROUP, nrt.VERSION, nrt.PLURAL)
        async for event in watch_list(lister, resource_version, timeout_seconds, WHAT, *args):
            yield event

    async def get(self, name: str) -> dict[str, Any]:
        body: dict[str, Any] = await _call(
            lambda: self.custom.get_cluster_custom_object(
                nrt.GROUP, nrt.VERSION, nrt.PLURAL, name, _preload_content=False
            ),
            f"get {WHAT} {name}",
        )
        return body

    async def publish(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Write `obj` as the node's object: patched in place, created when absent (and
        patched after all when a concurrent create won)."""
        name = str(obj["metadata"]["name"])
        try:
            return await self._patch(name, obj)
        except NotFound:
            pass
        try:
            created: dict[str, Any] = await _call(
                lambda: self.custom.create_cluster_custom_object(
                    nrt.GROUP, nrt.VERSION, nrt.PLURAL, dict(obj), _preload_content=False
                ),
                f"create {WHAT} {name}",
            )
            return created
        except Conflict:
            return await self._patch(name, obj)

    async def _patch(self, name: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = await _call(
            lambda: self.custom.patch_cluster_custom_object(  # type: ignore[call-arg]
                nrt.GROUP,
                nrt.VERSION,
                nrt.PLURAL,
                name,
                dict(obj),
                _content_type=MERGE_PATCH,
                _preload_content=False,
            ),
            f"patch {WHAT} {name}",
        )
        return body
