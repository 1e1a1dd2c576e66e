"""The scheduler's watch of Node objects: each node's kubelet version and advertised extended
resources, for predicting what kubelet itself would reject (shared/core/kubelet_version.py).

kube-scheduler sends the extender only node names (`nodeCacheCapable`), and a kubelet before
v1.31 rejects a pod whose init containers ask for an extended resource no device plugin
advertises (such as `nvidia.com/gpumem`) after the device plugin already ran: the filter leaves
such nodes out for such a pod, with the reason. One eternal task lists the Nodes, then watches
them (relisting after a 410, retrying failures with backoff: shared/service/follow.py). A node
not seen (yet), or without `status.nodeInfo.kubeletVersion`, is scheduled as before.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.core.kubelet_version import InitResourceRejection, init_resource_rejection
from shared.core.model import ContainerKind
from shared.core.resource_names import is_extended_resource_name
from shared.service.follow import follow

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from shared.core.pods import PodInfo
    from shared.service.kube_io import Kube
    from shared.service.supervisor import Supervisor

log = logging.getLogger("numafit.scheduler")

WATCH_TIMEOUT_SECONDS = 300
MAX_NODES = 65_536
"""Nodes remembered (a cluster has far fewer; a flood of made-up ones stops here)."""


@dataclass(frozen=True, slots=True)
class NodeKubelet:
    """What the filter needs of one Node: its kubelet version and the extended resources its
    allocatable lists."""

    version: str | None
    extended: frozenset[str]


def node_kubelet(obj: object) -> tuple[str, NodeKubelet] | None:
    """(name, what its kubelet is) of a Node object; None when it has no name."""
    if not isinstance(obj, dict):
        return None
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        return None
    status = obj.get("status")
    status = status if isinstance(status, dict) else {}
    info = status.get("nodeInfo")
    version = info.get("kubeletVersion") if isinstance(info, dict) else None
    allocatable = status.get("allocatable")
    extended = frozenset(
        key
        for key in (allocatable if isinstance(allocatable, dict) else {})
        if isinstance(key, str) and is_extended_resource_name(key)
    )
    return name, NodeKubelet(version if isinstance(version, str) else None, extended)


class NodeKubelets:
    """Every Node's kubelet as last seen (pure bookkeeping, fed by `NodeWatch`)."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeKubelet] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, name: str) -> NodeKubelet | None:
        return self._nodes.get(name)

    def apply(self, obj: object) -> None:
        found = node_kubelet(obj)
        if found is None:
            return
        name, kubelet = found
        if name in self._nodes or len(self._nodes) < MAX_NODES:
            self._nodes[name] = kubelet

    def drop(self, name: str) -> None:
        self._nodes.pop(name, None)

    def replace_all(self, objects: Iterable[object]) -> None:
        self._nodes.clear()
        for obj in objects:
            self.apply(obj)

    def rejections(
        self, pod: PodInfo, names: Iterable[str], plugin_resources: Iterable[str]
    ) -> Mapping[str, InitResourceRejection]:
        """The candidates whose kubelet would reject `pod` (kubelet_version's rule), with why.
        `plugin_resources`: the resources numafit's device plugin advertises on every node."""
        if all(c.kind is ContainerKind.APP for c in pod.containers):
            return {}  # no init container: nothing to reject (the common case, kept cheap)
        advertised = frozenset(plugin_resources)
        found: dict[str, InitResourceRejection] = {}
        for name in names:
            kubelet = self._nodes.get(name)
            if kubelet is None or kubelet.version is None:
                continue
            rejection = init_resource_rejection(
                kubelet.version, pod.containers, advertised | kubelet.extended
            )
            if rejection is not None:
                found[name] = rejection
        return found


class NodeWatch:
    """Follows the Nodes into a `NodeKubelets` (nothing to follow without an API client)."""

    def __init__(
        self,
        kube: Kube | None,
        state: NodeKubelets,
        supervisor: Supervisor,
        *,
        watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
    ) -> None:
        self.kube = kube
        self.state = state
        self.supervisor = supervisor
        self.watch_timeout_seconds = watch_timeout_seconds
        self.listed = asyncio.Event()
        """Set once the first list landed (`numafit simulate` waits for it before its first
        pod, so that every decision knows the nodes' kubelets)."""

    def start(self) -> None:
        if self.kube is not None:
            self.supervisor.spawn(self._follow(), "watch-nodes", eternal=True)

    async def _follow(self) -> None:
        kube = self.kube
        assert kube is not None
        await follow(
            "nodes",
            self._relist,
            lambda version: kube.watch("nodes", version, self.watch_timeout_seconds),
            self._on_event,
            log=log,
        )

    async def _relist(self) -> str:
        assert self.kube is not None
        items, version = await self.kube.list_nodes()
        self.state.replace_all(items)
        self.listed.set()
        return version

    async def _on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "DELETED":
            meta = obj.get("metadata")
            name = meta.get("name") if isinstance(meta, dict) else None
            if isinstance(name, str):
                self.state.drop(name)
            return
        self.state.apply(obj)
