"""What a read answers with: the object itself, a Table, or metadata only, as Accept asks.

Clients name the rendering in the Accept header's parameters, in order of preference:

    application/json;as=Table;v=v1;g=meta.k8s.io                  kubectl get
    application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io  metadata-only informers
    application/json (or protobuf, */*, nothing at all)           the object, as JSON

The emulator always answers JSON, which clients accept whatever they asked for first (they
decode by the response's Content-Type). Lists, single objects and every watch event are
rendered alike; a Table row's object follows `includeObject`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from . import errors, table
from .objects import metadata

if TYPE_CHECKING:
    from collections.abc import Callable

    from .objects import JSONDict
    from .resources import ResourceKind
    from .table import Include

Rendering = Literal["object", "Table", "PartialObjectMetadata", "PartialObjectMetadataList"]

_RENDERINGS: dict[str, Rendering] = {
    "Table": "Table",
    "PartialObjectMetadata": "PartialObjectMetadata",
    "PartialObjectMetadataList": "PartialObjectMetadataList",
}
_INCLUDE: dict[str, Include] = {"None": "None", "Metadata": "Metadata", "Object": "Object"}


@dataclass(frozen=True, slots=True)
class Wanted:
    rendering: Rendering = "object"
    version: str = "v1"
    """The meta.k8s.io version asked for (v1, or the older v1beta1)."""
    include: Include = "Metadata"


def negotiate(accept: str, include_object: str | None = None) -> Wanted:
    """What an Accept header (and includeObject) ask for; 406 when the header names only
    renderings, or media types, the emulator cannot produce."""
    include = _include(include_object)
    if not accept.strip():
        return Wanted(include=include)
    for entry in accept.split(","):
        media, *raw_params = (part.strip() for part in entry.split(";"))
        params = dict(p.partition("=")[::2] for p in raw_params if "=" in p)
        rendering = params.get("as")
        if rendering is None:
            if media.lower() in ("*/*", "application/*") or media.lower().startswith(
                "application/"
            ):
                return Wanted(include=include)
            continue
        known = _RENDERINGS.get(rendering)
        version = params.get("v", "")
        if known is not None and params.get("g") == "meta.k8s.io" and version in ("v1", "v1beta1"):
            return Wanted(known, version, include)
    raise errors.not_acceptable(accept)


def _include(value: str | None) -> Include:
    if not value:
        return "Metadata"
    found = _INCLUDE.get(value)
    if found is None:
        raise errors.bad_request(
            f'invalid includeObject "{value}": must be one of "None", "Metadata", "Object"'
        )
    return found


def render_list(
    kind: ResourceKind, objects: list[JSONDict], revision: str, wanted: Wanted
) -> JSONDict:
    """A list of objects (as clients see them, kind and apiVersion included) as asked for."""
    if wanted.rendering == "Table":
        return table.table(kind, objects, revision, wanted.include, wanted.version)
    if wanted.rendering != "object":
        return {
            "kind": "PartialObjectMetadataList",
            "apiVersion": f"meta.k8s.io/{wanted.version}",
            "metadata": {"resourceVersion": revision},
            "items": [table.partial_metadata(obj, wanted.version) for obj in objects],
        }
    items = []
    for obj in objects:
        # Items of a typed list carry no kind/apiVersion on the wire.
        item = dict(obj)
        item.pop("kind", None)
        item.pop("apiVersion", None)
        items.append(item)
    return {
        "kind": f"{kind.kind}List",
        "apiVersion": kind.api_version,
        "metadata": {"resourceVersion": revision},
        "items": items,
    }


def render_one(kind: ResourceKind, obj: JSONDict, wanted: Wanted) -> JSONDict:
    if wanted.rendering == "Table":
        revision = str(metadata(obj).get("resourceVersion", ""))
        return table.table(kind, [obj], revision, wanted.include, wanted.version)
    if wanted.rendering != "object":
        return table.partial_metadata(obj, wanted.version)
    return obj


def watch_renderer(kind: ResourceKind, wanted: Wanted) -> Callable[[JSONDict], JSONDict] | None:
    """How each watch event's object is shown (None: as itself)."""
    if wanted.rendering == "object":
        return None
    return lambda obj: render_one(kind, obj, wanted)
