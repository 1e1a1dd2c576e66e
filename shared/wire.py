"""Strict decoding of JSON messages at the service edge.

Messages are plain JSON objects (orjson); this module turns one into typed values or raises
WireError naming the field, so every handler replies `invalid_request` with a clear reason
instead of crashing on a KeyError deep inside.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson


class WireError(ValueError):
    """A message is not JSON, not an object, or has a field of the wrong type."""


def loads_object(data: bytes, what: str) -> Mapping[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise WireError(f"{what} must be a JSON object")
    return obj


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


class Reader:
    """Typed field access on one decoded message."""

    def __init__(self, obj: Mapping[str, Any], what: str) -> None:
        self.obj = obj
        self.what = what

    def _missing(self, key: str) -> WireError:
        return WireError(f"{self.what}: {key} is required")

    def text(self, key: str, default: str | None = None) -> str:
        value = self.obj.get(key, default)
        if value is None:
            raise self._missing(key)
        if not isinstance(value, str):
            raise WireError(f"{self.what}: {key} must be a string")
        return value

    def opt_text(self, key: str) -> str | None:
        value = self.obj.get(key)
        if value is not None and not isinstance(value, str):
            raise WireError(f"{self.what}: {key} must be a string")
        return value

    def integer(self, key: str, default: int | None = None, *, minimum: int | None = None) -> int:
        value = self.obj.get(key, default)
        if value is None:
            raise self._missing(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError(f"{self.what}: {key} must be an integer")
        if minimum is not None and value < minimum:
            raise WireError(f"{self.what}: {key} must be at least {minimum}")
        return value

    def opt_integer(self, key: str) -> int | None:
        if self.obj.get(key) is None:
            return None
        return self.integer(key)

    def boolean(self, key: str, default: bool | None = None) -> bool:
        value = self.obj.get(key, default)
        if value is None:
            raise self._missing(key)
        if not isinstance(value, bool):
            raise WireError(f"{self.what}: {key} must be a boolean")
        return value

    def texts(self, key: str, *, max_items: int | None = None) -> list[str]:
        value = self.obj.get(key)
        if value is None:
            raise self._missing(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise WireError(f"{self.what}: {key} must be a list of strings")
        if max_items is not None and len(value) > max_items:
            raise WireError(f"{self.what}: {key} has {len(value)} items, limit is {max_items}")
        return list(value)

    def objects(self, key: str) -> list[Mapping[str, Any]]:
        value = self.obj.get(key)
        if value is None:
            raise self._missing(key)
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise WireError(f"{self.what}: {key} must be a list of objects")
        return list(value)
