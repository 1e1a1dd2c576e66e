"""Errors raised by the pure core.

    CoreError (ValueError)
    ├── AnnotationError   an annotation value does not decode (codec, register JSON, weights)
    ├── ObjectError       a Kubernetes object lacks something the core needs (e.g. metadata.uid)
    ├── RequestError      a container's GPU resources cannot be turned into a request
    └── ConfigError       an unknown or mistyped scheduler configuration value

Every message names what is wrong so that a CLI can print it on one line and a service can
reply with it.
"""

from __future__ import annotations


class CoreError(ValueError):
    """Base class of every error the core raises on bad input."""


class AnnotationError(CoreError):
    """An annotation value is malformed."""


class ObjectError(CoreError):
    """A Kubernetes object is missing a field or has one of the wrong type."""


class RequestError(CoreError):
    """A container's resource request is invalid (rejected rather than under-allocated)."""


class ConfigError(CoreError):
    """A scheduler configuration value is unknown or of the wrong type."""
