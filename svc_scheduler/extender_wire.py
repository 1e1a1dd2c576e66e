"""kube-scheduler's extender wire shapes (k8s.io/kube-scheduler extender/v1), as msgspec structs.

The Go types carry no json tags, so keys are the Go field names: `Pod`, `Nodes`, `NodeNames`,
`FailedNodes`, `FailedAndUnresolvableNodes`, `Error`, `Host`, `Score`, `PodName`, ... Go decodes
keys case-insensitively, so a request's top-level keys are matched the same way (`decode` maps
them to the declared names first; an exact match wins over another case); answers use the exact
names. Nested Kubernetes objects stay raw JSON: the Pod is parsed by the core, the Node objects
are sent back as they came.

`nodeCacheCapable: true` sends `NodeNames` (and expects names back); false sends the full
`Nodes` NodeList (and expects the kept Node objects back). Returned nodes are always a subset of
the ones sent, or kube-scheduler refuses the answer.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Final, TypeVar

import msgspec
from msgspec import Meta, Raw, field

if TYPE_CHECKING:
    from collections.abc import Mapping

NonEmpty = Annotated[str, Meta(min_length=1)]


class BadInput(ValueError):
    """A body that is not the JSON shape of its route (answered 400). The text names the
    shape and the field, never the value."""


class Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """A JSON body of the scheduler's HTTP routes."""

    WHAT: ClassVar[str] = "request"


W = TypeVar("W", bound=Wire)

_TOP: Final = msgspec.json.Decoder(dict[str, Raw])
_ENCODER: Final = msgspec.json.Encoder()


def encode(body: Wire | list[Any] | Mapping[str, Any]) -> bytes:
    return _ENCODER.encode(body)


@functools.cache
def _decoder(kind: type[Wire]) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(kind)


@functools.cache
def _names(kind: type[Wire]) -> dict[str, str]:
    """The declared top-level keys of `kind`, by their lower-case form."""
    return {name.lower(): name for name in kind.__struct_encode_fields__}


def decode(data: bytes, kind: type[W], *, any_case: bool = True) -> W:
    """`data` as a `kind`, its top-level keys matched case-insensitively when `any_case`;
    `BadInput` naming the shape and the field otherwise."""
    what = kind.WHAT
    try:
        if any_case:
            top = _TOP.decode(data)
            names = _names(kind)
            canonical: dict[str, Raw] = {}
            for key, value in top.items():  # the first of the other cases, then an exact match
                name = names.get(key.lower())
                if name is not None and (key == name or name not in canonical):
                    canonical[name] = value
            data = _ENCODER.encode(canonical)
        body = _decoder(kind).decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if text.startswith("Expected `object`, got ") and " - at " not in text:
            raise BadInput(f"{what} must be a JSON object, got {text[23:]}") from None
        raise BadInput(f"{what}: {text}") from None
    except msgspec.DecodeError as exc:
        raise BadInput(f"{what} is not valid JSON: {exc}") from None
    assert isinstance(body, kind)
    return body


# --- /filter and /prioritize -----------------------------------------------------------------


class NodeMeta(msgspec.Struct, frozen=True):
    name: str = ""


class NodeRef(msgspec.Struct, frozen=True):
    """What is read of a Node object: its name."""

    metadata: NodeMeta = NodeMeta()


_NODE_REF: Final = msgspec.json.Decoder(NodeRef)


class NodeList(msgspec.Struct, frozen=True, kw_only=True):
    """`Nodes` of a request: only `items` is read, each Node kept as sent."""

    items: tuple[Raw, ...] | None = None


class ExtenderArgs(Wire, frozen=True, kw_only=True, dict=True):
    """`ExtenderArgs` of /filter and /prioritize. `NodeNames` wins when both forms are sent."""

    WHAT: ClassVar[str] = "ExtenderArgs"

    pod: Any = field(default=None, name="Pod")
    """The v1 Pod as sent; parsed by the core (a bad one is answered with `Error`)."""
    nodes: NodeList | None = field(default=None, name="Nodes")
    node_names: tuple[str, ...] | None = field(default=None, name="NodeNames")

    def __post_init__(self) -> None:
        if self.node_names is None and self.nodes is None:
            raise ValueError("neither NodeNames nor Nodes is set")
        _ = self.names  # every Node object names itself

    @property
    def cache_mode(self) -> bool:
        return self.node_names is not None

    @property
    def items(self) -> tuple[Raw, ...]:
        """The Node objects as sent (non-cache mode)."""
        return () if self.nodes is None else self.nodes.items or ()

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        """The candidates' names, in the order sent."""
        if self.node_names is not None:
            return self.node_names
        names = []
        for i, item in enumerate(self.items):
            try:
                name = _NODE_REF.decode(item).metadata.name
            except msgspec.ValidationError as exc:
                raise ValueError(f"Nodes.items[{i}] is not a Node object: {exc}") from None
            if not name:
                raise ValueError(f"Nodes.items[{i}] has no metadata.name")
            names.append(name)
        return tuple(names)


def parse_extender_args(data: bytes) -> ExtenderArgs:
    return decode(data, ExtenderArgs)


class NodeListResult(msgspec.Struct, frozen=True, kw_only=True):
    api_version: str = field(default="v1", name="apiVersion")
    kind: str = "NodeList"
    metadata: dict[str, str] = {}
    items: tuple[Raw, ...] = ()


class ExtenderFilterResult(Wire, frozen=True, kw_only=True):
    """`ExtenderFilterResult`: the kept nodes in the request's form (the other one null)."""

    WHAT: ClassVar[str] = "ExtenderFilterResult"

    nodes: NodeListResult | None = field(default=None, name="Nodes")
    node_names: tuple[str, ...] | None = field(default=None, name="NodeNames")
    failed_nodes: dict[str, str] = field(default_factory=dict, name="FailedNodes")
    failed_and_unresolvable_nodes: dict[str, str] = field(
        default_factory=dict, name="FailedAndUnresolvableNodes"
    )
    error: str = field(default="", name="Error")


def filter_result(
    args: ExtenderArgs | None,
    kept: list[str],
    failed: Mapping[str, str] | None = None,
    error: str = "",
) -> ExtenderFilterResult:
    """`ExtenderFilterResult` in the form the request used (names when none was readable)."""
    if args is None or args.cache_mode:
        names = None if args is None else tuple(kept)
        return ExtenderFilterResult(node_names=names, failed_nodes=dict(failed or {}), error=error)
    wanted = set(kept)
    items = tuple(n for n, name in zip(args.items, args.names, strict=True) if name in wanted)
    return ExtenderFilterResult(
        nodes=NodeListResult(items=items), failed_nodes=dict(failed or {}), error=error
    )


def error_filter_result(args: ExtenderArgs | None, error: str) -> ExtenderFilterResult:
    """An answer that fails the scheduling attempt with `error` (no node kept)."""
    return filter_result(args, [], None, error)


class HostPriority(msgspec.Struct, frozen=True):
    """One entry of a `HostPriorityList` (0..10)."""

    host: str = field(name="Host")
    score: int = field(name="Score")


def host_priority_list(scores: Mapping[str, int]) -> list[HostPriority]:
    """`HostPriorityList`: one `{"Host", "Score"}` per node, in the order given."""
    return [HostPriority(host, score) for host, score in scores.items()]


# --- /bind -----------------------------------------------------------------------------------


class BindingArgs(Wire, frozen=True, kw_only=True):
    """`ExtenderBindingArgs` of /bind."""

    WHAT: ClassVar[str] = "ExtenderBindingArgs"

    pod_name: NonEmpty = field(name="PodName")
    pod_namespace: NonEmpty = field(name="PodNamespace")
    pod_uid: NonEmpty = field(name="PodUID")
    node: NonEmpty = field(name="Node")


def parse_binding_args(data: bytes) -> BindingArgs:
    return decode(data, BindingArgs)


class BindingResult(Wire, frozen=True, kw_only=True):
    """`ExtenderBindingResult`."""

    WHAT: ClassVar[str] = "ExtenderBindingResult"

    error: str = field(default="", name="Error")


def binding_result(error: str = "") -> BindingResult:
    return BindingResult(error=error)
