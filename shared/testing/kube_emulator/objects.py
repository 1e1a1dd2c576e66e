"""Plain-JSON Kubernetes objects: the one type alias and the few helpers every module needs.

The emulator keeps objects as the wire carries them (dicts parsed from JSON) rather than typed
models, so that it never reshapes what a client sent. The only fields it drops are those the
API server's types lack (field_validation.py prunes them, as upstream's decoding does); open
parts of the schema (statuses, probes, affinity...) come back exactly as they went in.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson

JSONDict = dict[str, Any]
"""A JSON object as parsed by orjson: the shape of every stored object and request body."""


def copy_json(obj: JSONDict) -> JSONDict:
    """A deep copy of a JSON object.

    A round trip through orjson is several times faster than copy.deepcopy on JSON-shaped data,
    and it also proves that the object stays serialisable.
    """
    copied: JSONDict = orjson.loads(orjson.dumps(obj))
    return copied


def metadata(obj: JSONDict) -> JSONDict:
    """obj["metadata"], created empty when absent or not an object."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
        obj["metadata"] = meta
    return meta


def child(obj: JSONDict, key: str) -> JSONDict:
    """obj[key] when it is a JSON object, else an empty dict (not stored back)."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def now_rfc3339() -> str:
    """The current UTC time in the API server's metav1.Time format (whole seconds, Z suffix)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
