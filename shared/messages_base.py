"""What every NATS message of numafit shares: the `Message` and `Shape` bases, the integer
types their fields use, `MessageError`, and `encode` / `decode`.

`encode(msg)` writes what the services wrote by hand, and `decode(data, Type)` reads what they
send, raising `MessageError` (a `ValueError`) naming the message and the field: `refit request:
Expected `int`, got `str` - at `$.containerIndex``. The messages themselves are in one module
per family (messages_refit, messages_accounting, messages_usage, and the shapes nested in
accounting's replies in messages_shapes); shared/messages.py names them all.

How fields are omitted. A field is left out of the JSON exactly when its sender leaves it out:

- messages (`Message`) omit fields at their default, which is `None` (or `False`) for every
  field a sender writes only sometimes (`error`, `revision`, `podResourceVersion`, ...);
- a field typed `... | UnsetType` is written exactly when it was set (absent on the wire is
  `UNSET`): `"pod": null` (pending, and a snapshot asked with a podUID) beside no `pod` at
  all (refusals), `containerName` only when the sender wrote one, `v` only when set;
- nested shapes (`Shape`) and the refit request write every field (today's encoders write
  `"devices": null`, `"limitMem": null`, `"containerIndex": 0`, `"timeoutMs": 2000`, ...),
  except those `UNSET`.

Schema version. Every message has `v`, its schema version. Absent means 1: HAMi's device plugin
and every sender before this module send none, and numafit's own encoder leaves it out at 1, so
today's bytes are unchanged. `v` is bumped only for a change old readers would misread (adding
a field is not one: unknown fields are ignored), and `decode` refuses a message newer than its
type's `VERSION` rather than misreading it.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, TypeVar

import msgspec
from msgspec import UNSET, Meta, UnsetType

from shared.core import refit as core_refit

MAX_ERROR_LENGTH: Final = 300
"""A `MessageError`'s text is cut to this many characters (input is never echoed whole)."""

# Integers within 64 bits, as today's JSON parser (orjson) read them: a larger literal became a
# float there, refused as "must be an integer".
Int = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
NonNegative = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Positive = Annotated[int, Meta(ge=1, le=2**63 - 1)]
Version = Annotated[int, Meta(ge=1, le=2**31 - 1)]
TimeoutMs = Annotated[int, Meta(ge=1, le=core_refit.MAX_TIMEOUT_MS)]


class MessageError(ValueError):
    """A message is not JSON, not an object, has a field of the wrong type or out of range,
    or cannot be turned into the core's types. The text names the message and the field."""


class Message(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    omit_defaults=True,
    rename="camel",
    forbid_unknown_fields=False,
):
    """A top-level NATS message body."""

    WHAT: ClassVar[str] = "message"
    """How errors name this message."""
    VERSION: ClassVar[int] = 1
    """The newest schema version of this message this build reads and writes."""

    v: Version | UnsetType = UNSET
    """Schema version; absent means 1 (see the module docstring)."""

    @property
    def version(self) -> int:
        return 1 if isinstance(self.v, UnsetType) else self.v


class Shape(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=False):
    """A JSON object nested in a message: every field is written, at its default too."""


def cut(text: str, limit: int = MAX_ERROR_LENGTH) -> str:
    """An error text cut to `limit` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[: limit - 30]}... ({len(text)} characters)"


# --- encoding and decoding ------------------------------------------------------------------

M = TypeVar("M", bound=Message)

_ENCODER: Final = msgspec.json.Encoder()
_DECODERS: dict[type[Message], msgspec.json.Decoder[Any]] = {}


def encode(message: Message) -> bytes:
    return _ENCODER.encode(message)


def decode(data: bytes | bytearray | memoryview | str, kind: type[M]) -> M:
    """`data` as a `kind` message; `MessageError` naming the message and the field otherwise."""
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.json.Decoder(kind)
    what = kind.WHAT
    try:
        message = decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise MessageError(_explain(what, str(exc))) from exc
    except msgspec.DecodeError as exc:
        raise MessageError(cut(f"{what} is not valid JSON: {exc}")) from exc
    assert isinstance(message, kind)
    if message.version > kind.VERSION:
        raise MessageError(
            f"{what}: schema version {message.version} is newer than {kind.VERSION}, "
            "the newest this build reads"
        )
    return message


def _explain(what: str, text: str) -> str:
    if text.startswith("Expected `object`, got `") and " - at " not in text:
        return f"{what} must be a JSON object, got {text.removeprefix('Expected `object`, got ')}"
    return cut(f"{what}: {text}")
