"""The GPU pods not yet bound, as accounting's own pod watch shows them.

A filter's reserve checks the pod it holds a reservation for (its uid, that it has neither
ended nor been bound, its containers' phases): reading the pod from the API server for every
filter put a read (on a real API server a quorum read) on kube-scheduler's critical path, and
11 % of accounting's CPU in a filter loop. The pod watch already delivers every pod, so the
unbound ones that ask for GPUs are kept here, each as its newest event showed it. A pod this
index does not hold (not yet delivered, or past the bound) is read from the API server as
before, and so is one accounting knows a newer version of (its own writes reach the ledger
before the watch echoes them).

What the index can miss is the watch's lag: a pod deleted or bound by someone else a moment
ago may still be here. A reservation held for it is harmless: the deletion releases it when its
event arrives, and a bind is guarded by the pod's resourceVersion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.requests import pod_asks_for_gpu
from svc_accounting.ledger import newer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from shared.core.config import CoreConfig
    from shared.core.pods import PodInfo

MAX_UNBOUND = 65536
"""Pods kept at most (a backlog beyond it is read from the API server)."""


class UnboundPods:
    def __init__(self, config: CoreConfig, limit: int = MAX_UNBOUND) -> None:
        self.config = config
        self.limit = limit
        self._pods: dict[str, PodInfo] = {}

    def __len__(self) -> int:
        return len(self._pods)

    def observe(self, pod: PodInfo) -> None:
        """A pod as the list or the watch shows it."""
        if pod.node_name or pod.terminal or pod.deleting or not pod_asks_for_gpu(pod, self.config):
            self._pods.pop(pod.uid, None)
            return
        known = self._pods.get(pod.uid)
        if known is not None and not newer(pod.resource_version, known.resource_version):
            return  # a stale event must not replace a newer one
        if known is None and len(self._pods) >= self.limit:
            return
        self._pods[pod.uid] = pod

    def forget(self, uid: str) -> None:
        self._pods.pop(uid, None)

    def retain(self, uids: Iterable[str]) -> None:
        """After a full list: only the pods it listed remain."""
        listed = set(uids)
        for uid in [u for u in self._pods if u not in listed]:
            del self._pods[uid]

    def get(
        self, uid: str, namespace: str, name: str, *, known: Iterable[str] = ()
    ) -> PodInfo | None:
        """The unbound pod `uid` named `namespace/name`, unless a version accounting knows of
        it otherwise (`known` resourceVersions) is newer than the one kept here."""
        pod = self._pods.get(uid)
        if pod is None or (pod.namespace, pod.name) != (namespace, name):
            return None
        if any(v and newer(v, pod.resource_version) for v in known):
            return None
        return pod
