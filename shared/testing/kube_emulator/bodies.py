"""Request bodies in the formats the API server reads: JSON, YAML and Kubernetes protobuf.

The Content-Type chooses the decoder, as upstream's negotiation does: JSON (also when no
Content-Type is sent at all, as some hand-written clients do), YAML (apply patches and
`application/yaml` objects; anchors and aliases are refused so a small body cannot expand into
a huge one), or protobuf (protobuf.py). Anything else is 415.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import yaml

from . import errors, protobuf

if TYPE_CHECKING:
    from aiohttp import web

    from .objects import JSONDict

JSON_TYPES = frozenset({"application/json"})
YAML_TYPES = frozenset({"application/yaml", "application/apply-patch+yaml"})


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML without aliases (a few lines of nested aliases can mean gigabytes)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.constructor.ConstructorError(None, None, "YAML aliases are not accepted")
        return super().compose_node(parent, index)


def parse_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise errors.bad_request(f"couldn't get version/kind; json parse error: {error}") from None


def parse_yaml(raw: bytes) -> Any:
    # JSON is YAML, and much faster to read as JSON: kubectl sends apply patches as JSON.
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return yaml.load(raw, Loader=_NoAliasLoader)
    except yaml.YAMLError as error:
        raise errors.bad_request(f"error decoding YAML: {error}") from None
    except RecursionError:
        raise errors.bad_request("error decoding YAML: nested too deeply") from None


def _content_type(request: web.Request) -> str | None:
    """The media type without parameters, or None when the request names none."""
    if "Content-Type" not in request.headers:
        return None
    return request.content_type.lower()


async def read_any(request: web.Request) -> Any:
    """A JSON or YAML body (patches, DeleteOptions), by Content-Type."""
    raw = await request.read()
    media = _content_type(request)
    if media in YAML_TYPES:
        return parse_yaml(raw)
    return parse_json(raw)


async def read_object(request: web.Request) -> JSONDict:
    """An object body (create, update, binding), decoded by its Content-Type."""
    raw = await request.read()
    media = _content_type(request)
    body: Any
    if media is None or media in JSON_TYPES:
        body = parse_json(raw)
    elif media == "application/yaml":
        body = parse_yaml(raw)
    elif media == protobuf.CONTENT_TYPE:
        try:
            body = protobuf.decode(raw)
        except protobuf.ProtobufError as error:
            raise errors.bad_request(str(error)) from None
        except protobuf.UnsupportedProtobuf as error:
            raise errors.unsupported_media_type(
                f"{media}: {error}", errors.BODY_MEDIA_TYPES
            ) from None
    else:
        raise errors.unsupported_media_type(media, errors.BODY_MEDIA_TYPES)
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a JSON object")
    return body
