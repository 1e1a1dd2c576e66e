"""Discovery documents (/api, /api/v1, /apis, /apis/{group}[/{version}], /version).

Clients and tools fetch these to learn which resources and verbs exist; they list exactly what
the emulator serves, derived from resources.ALL, so discovery never promises more than that.
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING

from .resources import ALL, ResourceKind

if TYPE_CHECKING:
    from .objects import JSONDict

KUBERNETES_VERSION = ("1", "33")
_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
_SUBRESOURCE_VERBS = {"status": ["get", "patch", "update"], "binding": ["create"]}
_SUBRESOURCE_KINDS = {"binding": "Binding"}


def version() -> JSONDict:
    major, minor = KUBERNETES_VERSION
    return {
        "major": major,
        "minor": minor,
        "gitVersion": f"v{major}.{minor}.0-numafit-kube-emulator",
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "",
        "platform": f"{platform.system().lower()}/{platform.machine()}",
    }


def core_versions(server_address: str) -> JSONDict:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def groups() -> list[str]:
    return sorted({kind.group for kind in ALL if kind.group})


def _group_body(group: str) -> JSONDict:
    versions = sorted({kind.version for kind in ALL if kind.group == group})
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def group_list() -> JSONDict:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_body(g) for g in groups()],
    }


def group(name: str) -> JSONDict | None:
    if name not in groups():
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_body(name)}


def resource_list(api_version: str) -> JSONDict | None:
    """The APIResourceList of one group/version, or None when it is not served."""
    kinds = [kind for kind in ALL if kind.api_version == api_version]
    if not kinds:
        return None
    resources: list[JSONDict] = []
    for kind in kinds:
        resources.append(_resource(kind))
        for subresource in sorted(kind.subresources):
            resources.append(
                {
                    "name": f"{kind.plural}/{subresource}",
                    "singularName": "",
                    "namespaced": kind.namespaced,
                    "kind": _SUBRESOURCE_KINDS.get(subresource, kind.kind),
                    "verbs": _SUBRESOURCE_VERBS[subresource],
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": api_version,
        "resources": resources,
    }


def _resource(kind: ResourceKind) -> JSONDict:
    entry: JSONDict = {
        "name": kind.plural,
        "singularName": kind.singular,
        "namespaced": kind.namespaced,
        "kind": kind.kind,
        "verbs": _VERBS,
    }
    if kind.short_names:
        entry["shortNames"] = list(kind.short_names)
    if kind.categories:
        entry["categories"] = list(kind.categories)
    return entry
