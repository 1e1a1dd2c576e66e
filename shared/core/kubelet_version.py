"""What a node's kubelet version means for a pod: one pure rule, two users.

kubelet admits a pod only if the node has what it asks for, but first strips the extended
resources no device plugin advertises (cluster-level resources an extender manages, such as
HAMi's `nvidia.com/gpumem` and `nvidia.com/gpucores`). Before v1.31 it strips them from app
containers only (`removeMissingExtendedResources`, kubernetes/kubernetes#124255, fixed by
#124273, merged April 2024 after the v1.30 freeze, first released in v1.31.0; no backport to a
1.28, 1.29 or 1.30 patch release was found, so every version before v1.31 counts as affected).
An init container asking for one of them therefore fails the pod with
`OutOf<resource> ... capacity: 0`, after the Topology Manager's handler already called the
device plugin (a reservation was made, a refit may have moved it).

The kubelet emulator rejects such a pod when it plays an affected version, and the scheduler
filters such nodes out for such a pod (`FailedNodes`, reason `KUBELET_REJECTS_INIT_RESOURCES`):
the same function decides both. A version that does not parse (a Node without
`status.nodeInfo.kubeletVersion`) predicts nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from shared.core.errors import RequestError
from shared.core.model import ContainerKind
from shared.core.quantity import parse_quantity
from shared.core.resource_names import is_extended_resource_name

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence

    from shared.core.pods import ContainerSpec

FIXED_IN: Final = (1, 31, 0)
"""The first kubelet that strips unadvertised extended resources from init containers too."""
KUBELET_REJECTS_INIT_RESOURCES: Final = "KubeletRejectsInitContainerResources"
"""FailedNodes reason of a node whose kubelet would reject the pod for it."""
ISSUE: Final = "kubernetes/kubernetes#124255"

_VERSION = re.compile(r"^v?(\d{1,4})\.(\d{1,4})\.(\d{1,6})")


def parse_kubelet_version(text: object) -> tuple[int, int, int] | None:
    """`v1.28.7`, `v1.29.3-eks-ae9a62a`, `v1.30.2+k3s1` as (major, minor, patch); None for
    anything else (not predicted)."""
    if not isinstance(text, str) or len(text) > 128:
        return None
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def strips_init_container_resources(version: tuple[int, int, int]) -> bool:
    """Whether this kubelet strips unadvertised extended resources from init containers."""
    return version >= FIXED_IN


@dataclass(frozen=True, slots=True)
class InitResourceRejection:
    """Why kubelet would reject the pod: the resource it would name (`OutOf<resource>`), the
    pod's request for it (the largest of its init containers': app containers' are stripped),
    and the init containers asking for it."""

    resource: str
    requested: int
    containers: tuple[str, ...]
    version: str

    @property
    def kubelet_reason(self) -> str:
        return f"OutOf{self.resource}"

    def filter_reason(self) -> str:
        """The FailedNodes text (kubectl describe pod shows it)."""
        names = ", ".join(self.containers)
        return (
            f"{KUBELET_REJECTS_INIT_RESOURCES}: kubelet {self.version} would reject the pod "
            f"({self.kubelet_reason}): init container {names} asks for {self.resource}, which "
            f"no device plugin advertises, and kubelet before v1.31 strips such resources from "
            f"app containers only ({ISSUE}); upgrade the node's kubelet to v1.31 or later, or "
            f"ask for {self.resource} in app containers only"
        )


def init_resource_requests(
    containers: Sequence[ContainerSpec], advertised: Collection[str]
) -> dict[str, dict[str, int]]:
    """Per unadvertised extended resource, what each init container (sidecars included: they
    are `spec.initContainers` too) asks for it (a missing request is its limit)."""
    asked: dict[str, dict[str, int]] = {}
    for container in containers:
        if container.kind is ContainerKind.APP:
            continue
        names = set(container.limits) | set(container.requests)
        for name in sorted(names):
            if name in advertised or not is_extended_resource_name(name):
                continue
            value = container.requests.get(name, container.limits.get(name))
            quantity = _whole(value)
            if quantity > 0:
                asked.setdefault(name, {})[container.name] = quantity
    return asked


def init_resource_rejection(
    version: str | None, containers: Sequence[ContainerSpec], advertised: Collection[str]
) -> InitResourceRejection | None:
    """Why a kubelet of `version` would reject a pod of `containers` on a node advertising the
    extended resources `advertised` (device plugin resources and any the Node's allocatable
    lists), or None: it would not, or the version is unknown. kubelet checks the resources in
    map order; the first by name stands in for it here."""
    parsed = parse_kubelet_version(version)
    if parsed is None or strips_init_container_resources(parsed):
        return None
    asked = init_resource_requests(containers, advertised)
    if not asked:
        return None
    resource = min(asked)
    per_container = asked[resource]
    assert version is not None  # it parsed
    return InitResourceRejection(
        resource, max(per_container.values()), tuple(per_container), version.strip()
    )


def pod_resource_requests(
    containers: Sequence[ContainerSpec], names: Collection[str]
) -> Mapping[str, int]:
    """The pod's request for each of `names`, as kubelet sums a pod (the larger of its largest
    init container's and its app containers' and sidecars' together)."""
    result: dict[str, int] = {}
    for name in names:
        inits = [
            _whole(c.requests.get(name, c.limits.get(name)))
            for c in containers
            if c.kind is ContainerKind.INIT
        ]
        running = sum(
            _whole(c.requests.get(name, c.limits.get(name)))
            for c in containers
            if c.kind is not ContainerKind.INIT
        )
        total = max([*inits, running])
        if total:
            result[name] = total
    return result


def _whole(value: object) -> int:
    if value is None:
        return 0
    try:
        quantity = parse_quantity(value)
    except RequestError:
        return 0
    return int(quantity) if quantity > 0 else 0
