"""Turning a request path into what it addresses, the way the API server's RequestInfo does.

    /api/v1/namespaces/{ns}/{resource}[/{name}[/{subresource}]]
    /api/v1/{resource}[/{name}[/{subresource}]]            cluster-scoped, or all namespaces
    /apis/{group}/{version}/...                              the same under a group
    .../watch/...                                            the legacy watch prefix

`/api/v1/namespaces/{name}` is the namespace object itself, and `/api/v1/namespaces/{name}/status`
its status, exactly as upstream disambiguates them.
"""

from __future__ import annotations

from dataclasses import dataclass

_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


@dataclass(frozen=True, slots=True)
class Target:
    api_version: str
    resource: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    watch_prefix: bool = False


def parse(path: str) -> Target | None:
    """What `path` addresses, or None when it is not a resource path at all."""
    parts = path.strip("/").split("/")
    if parts[:2] == ["api", "v1"]:
        api_version, rest = "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        api_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        return None
    watch_prefix = bool(rest) and rest[0] == "watch"
    if watch_prefix:
        rest = rest[1:]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in _NAMESPACE_SUBRESOURCES:
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3 or "" in rest:
        return None
    return Target(
        api_version=api_version,
        resource=rest[0],
        namespace=namespace,
        name=rest[1] if len(rest) > 1 else None,
        subresource=rest[2] if len(rest) > 2 else None,
        watch_prefix=watch_prefix,
    )
