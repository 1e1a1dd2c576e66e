"""The protocol buffers wire format, by hand: just enough to read and write Kubernetes' messages.

Two users, no generated code: protobuf.py reads the bodies kubectl's generators send
(`application/vnd.kubernetes.protobuf`) and openapi_proto.py writes the OpenAPI v2 document
older kubectl versions only accept as protobuf. Both know their messages' field numbers from a
table; this module knows only tags, varints and length-delimited bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message; str() says where it went wrong."""


@dataclass(frozen=True, slots=True)
class WireField:
    """One field occurrence: its number, wire type and raw value (an int or bytes)."""

    number: int
    wire_type: int
    value: int | bytes


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if position >= len(data):
            raise WireError("truncated varint")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift >= 64:
            raise WireError("varint longer than 10 bytes")


def fields(data: bytes) -> Iterator[WireField]:
    """The fields of one message, in wire order (repeated fields occur once per element)."""
    position = 0
    while position < len(data):
        key, position = _read_varint(data, position)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        value: int | bytes
        if wire_type == VARINT:
            value, position = _read_varint(data, position)
        elif wire_type == LENGTH:
            size, position = _read_varint(data, position)
            if position + size > len(data):
                raise WireError(f"field {number} runs past the end of the message")
            value, position = data[position : position + size], position + size
        elif wire_type in (FIXED64, FIXED32):
            width = 8 if wire_type == FIXED64 else 4
            if position + width > len(data):
                raise WireError(f"field {number} runs past the end of the message")
            value = int.from_bytes(data[position : position + width], "little")
            position += width
        else:
            raise WireError(f"unsupported wire type {wire_type} for field {number}")
        yield WireField(number, wire_type, value)


def signed64(value: int) -> int:
    """A varint read back as int64/int32 (negative numbers are ten-byte two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


# --- writing -------------------------------------------------------------------------------------


def varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def length_delimited(number: int, payload: bytes) -> bytes:
    return tag(number, LENGTH) + varint(len(payload)) + payload


def string(number: int, text: str) -> bytes:
    return length_delimited(number, text.encode())


def boolean(number: int, flag: bool) -> bytes:
    return tag(number, VARINT) + varint(int(flag))
