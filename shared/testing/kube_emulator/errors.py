"""Kubernetes API errors as the API server writes them: `Status` objects with its exact wording.

Clients branch on `code` and `reason` (kubernetes-asyncio raises ApiException(status=code);
controllers test for Conflict to retry), and people read `message`, so both follow
k8s.io/apimachinery/pkg/api/errors. Every failure inside the emulator is a KubeError carrying the
Status it answers with; nothing else is turned into an HTTP error.

    KubeError            one exception, one Status body; built by the functions below
    FieldError           one validation failure, aggregated by `invalid` into a 422
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .objects import JSONDict

OBJECT_MODIFIED = (
    "the object has been modified; please apply your changes to the latest version and try again"
)
"""The API server's conflict text for a stale resourceVersion (optimistic concurrency)."""

# Reason for an HTTP code where the API server has a canonical one (metav1.StatusReason*).
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class KubeError(Exception):
    """A failed request, answered with `status` (a v1 Status object) and HTTP `status["code"]`."""

    def __init__(self, status: JSONDict) -> None:
        super().__init__(status.get("message", ""))
        self.status = status

    @property
    def code(self) -> int:
        code = self.status["code"]
        assert isinstance(code, int)
        return code


def status_object(
    code: int, message: str, reason: str | None = None, details: JSONDict | None = None
) -> JSONDict:
    """A Failure Status; `reason` defaults to the canonical one for `code`."""
    status: JSONDict = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
    }
    reason = _REASONS.get(code, "") if reason is None else reason
    if reason:
        status["reason"] = reason
    if details is not None:
        status["details"] = details
    status["code"] = code
    return status


def success_status(code: int) -> JSONDict:
    """The Success Status some subresources (pods/binding) answer with instead of an object."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code}


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def _details(resource: str, name: str, group: str) -> JSONDict:
    details: JSONDict = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = resource
    return details


def not_found(resource: str, name: str, group: str = "") -> KubeError:
    return KubeError(
        status_object(
            404,
            f'{_qualified(resource, group)} "{name}" not found',
            None,
            _details(resource, name, group),
        )
    )


def already_exists(resource: str, name: str, group: str = "") -> KubeError:
    return KubeError(
        status_object(
            409,
            f'{_qualified(resource, group)} "{name}" already exists',
            "AlreadyExists",
            _details(resource, name, group),
        )
    )


def conflict(resource: str, name: str, why: str = OBJECT_MODIFIED, group: str = "") -> KubeError:
    message = f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {why}'
    return KubeError(status_object(409, message, "Conflict", _details(resource, name, group)))


def bad_request(message: str) -> KubeError:
    return KubeError(status_object(400, message))


def path_not_found() -> KubeError:
    """What the API server answers for a URL it does not serve at all."""
    return KubeError(
        status_object(404, "the server could not find the requested resource", None, {})
    )


def method_not_allowed() -> KubeError:
    return KubeError(
        status_object(
            405, "the server does not allow this method on the requested resource", None, {}
        )
    )


PATCH_MEDIA_TYPES = (
    "application/json-patch+json, application/merge-patch+json, "
    "application/strategic-merge-patch+json, application/apply-patch+yaml"
)
BODY_MEDIA_TYPES = "application/json, application/yaml, application/vnd.kubernetes.protobuf"


def unsupported_media_type(content_type: str, accepted: str = PATCH_MEDIA_TYPES) -> KubeError:
    return KubeError(
        status_object(
            415,
            f"the body of the request was in an unknown format ({content_type}) - accepted media "
            f"types include: {accepted}",
        )
    )


def not_acceptable(accept: str) -> KubeError:
    """406: no response format in the Accept header is one the server can write."""
    return KubeError(
        status_object(
            406,
            "only the following media types are accepted: application/json, application/yaml, "
            f"application/vnd.kubernetes.protobuf (asked for {accept})",
        )
    )


def internal(message: str) -> KubeError:
    return KubeError(
        status_object(
            500, f"Internal error occurred: {message}", None, {"causes": [{"message": message}]}
        )
    )


def expired(message: str) -> KubeError:
    """410: a watch asked for history the server no longer keeps; the client must relist."""
    return KubeError(status_object(410, message))


def too_large_resource_version(requested: int, current: int) -> KubeError:
    return KubeError(
        status_object(
            504,
            f"Too large resource version: {requested}, current: {current}",
            None,
            {
                "causes": [
                    {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
                ],
                "retryAfterSeconds": 1,
            },
        )
    )


def from_code(code: int, message: str) -> KubeError:
    """A Status for an arbitrary code (fault injection), with the canonical reason if any."""
    return KubeError(status_object(code, message, None, {}))


def admission_denied(webhook: str, message: str, code: int, reason: str) -> KubeError:
    """A refusal worded as apiserver's webhook ToStatusErr does; codes under 400 become 400."""
    denied_by = f'admission webhook "{webhook}" denied the request'
    text = f"{denied_by}: {message}" if message else f"{denied_by} without explanation"
    return KubeError(status_object(max(code, 400), text, reason))


FieldErrorType = Literal[
    "required", "invalid", "forbidden", "not_supported", "immutable", "too_long"
]

# (StatusCause type, the words field.Error prints) per FieldErrorType.
_FIELD_ERROR_WORDS: dict[str, tuple[str, str]] = {
    "required": ("FieldValueRequired", "Required value"),
    "invalid": ("FieldValueInvalid", "Invalid value"),
    "immutable": ("FieldValueInvalid", "Invalid value"),
    "forbidden": ("FieldValueForbidden", "Forbidden"),
    "not_supported": ("FieldValueNotSupported", "Unsupported value"),
    "too_long": ("FieldValueTooLong", "Too long"),
}


@dataclass(frozen=True, slots=True)
class FieldError:
    """One validation failure, worded like k8s.io/apimachinery/pkg/util/validation/field.Error."""

    field: str
    type: FieldErrorType
    detail: str = ""
    value: object = None

    def body(self) -> str:
        words = _FIELD_ERROR_WORDS[self.type][1]
        if self.type in ("invalid", "immutable", "not_supported"):
            words = f"{words}: {_go_quote(self.value)}"
        detail = "field is immutable" if self.type == "immutable" else self.detail
        return f"{words}: {detail}" if detail else words

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"

    def cause(self) -> JSONDict:
        return {
            "reason": _FIELD_ERROR_WORDS[self.type][0],
            "message": self.body(),
            "field": self.field,
        }


def _go_quote(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def invalid(kind: str, name: str, errors: list[FieldError], group: str = "") -> KubeError:
    """422 Invalid: `Kind "name" is invalid: <error>` or `...: [<error>, <error>]`."""
    listed = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    details: JSONDict = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = [error.cause() for error in errors]
    qualified = f"{kind}.{group}" if group else kind
    return KubeError(
        status_object(422, f'{qualified} "{name}" is invalid: {listed}', None, details)
    )
