"""Errors raised by the pure core.

    CoreError (ValueError)
    ├── AnnotationError   an annotation value does not decode (codec, register JSON, weights)
    │   └── PodAnnotationError   a pod annotation numafit reads breaks its rule (inputs.py)
    ├── ObjectError       a Kubernetes object lacks something the core needs (e.g. metadata.uid)
    ├── RequestError      a container's GPU resources cannot be turned into a request
    └── ConfigError       an unknown or mistyped scheduler configuration value

Every message names what is wrong so that a CLI can print it on one line and a service can
reply with it; a value from outside is quoted through `shown`, so that it stays short.
"""

from __future__ import annotations

SHOWN_CHARS = 64
"""Characters of an outside value quoted in a message (the rest is cut, its size given)."""


def shown(value: object) -> str:
    """`value` for an error message: repr'd and cut. Pod annotations and quantities come from
    users, and a refusal quoting a 1 MiB value whole would flood the webhook's denial, the
    filter's Error and every log line carrying them."""
    if not isinstance(value, str):
        text = repr(value)
        return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}..."
    if len(value) <= SHOWN_CHARS:
        return repr(value)
    size = len(value.encode("utf-8", "surrogatepass"))
    return f"{value[:SHOWN_CHARS]!r}... ({size} bytes)"


class CoreError(ValueError):
    """Base class of every error the core raises on bad input."""


class AnnotationError(CoreError):
    """An annotation value is malformed."""


class PodAnnotationError(AnnotationError):
    """A pod annotation numafit reads has a value its rule refuses; `key` names it (the
    webhook's refusal reason depends on which)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class ObjectError(CoreError):
    """A Kubernetes object is missing a field or has one of the wrong type."""


class RequestError(CoreError):
    """A container's resource request is invalid (rejected rather than under-allocated)."""


class ConfigError(CoreError):
    """A scheduler configuration value is unknown or of the wrong type."""
