"""kube-scheduler's extender wire shapes: Go field names, both nodeCacheCapable forms, keys in
any case (as Go decodes them), errors naming the shape and the field."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson
import pytest

from svc_scheduler.extender_wire import (
    BadInput,
    binding_result,
    encode,
    error_filter_result,
    filter_result,
    host_priority_list,
    parse_binding_args,
    parse_extender_args,
)

POD: dict[str, Any] = {"metadata": {"name": "p", "uid": "u"}}


def wire(body: Any) -> bytes:
    return orjson.dumps(body)


def sent(body: Any) -> Any:
    """What the scheduler writes, as kube-scheduler reads it."""
    return orjson.loads(encode(body))


def test_cache_mode_names_in_names_out() -> None:
    args = parse_extender_args(wire({"Pod": POD, "Nodes": None, "NodeNames": ["a", "b"]}))
    assert args.cache_mode and args.names == ("a", "b") and args.pod == POD
    assert sent(filter_result(args, ["b"], {"a": "1/1 CardInsufficientMemory"})) == {
        "Nodes": None,
        "NodeNames": ["b"],
        "FailedNodes": {"a": "1/1 CardInsufficientMemory"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_non_cache_mode_objects_in_objects_out() -> None:
    items = [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}, "spec": {"x": [1, 2]}}]
    args = parse_extender_args(wire({"Pod": POD, "Nodes": {"items": items}, "NodeNames": None}))
    assert not args.cache_mode and args.names == ("a", "b")
    result = sent(filter_result(args, ["b"]))
    assert result["NodeNames"] is None
    assert result["Nodes"] == {
        "apiVersion": "v1",
        "kind": "NodeList",
        "metadata": {},
        "items": [items[1]],  # sent back exactly as it came
    }
    assert sent(error_filter_result(args, "no"))["Nodes"]["items"] == []


def test_empty_node_list() -> None:
    args = parse_extender_args(wire({"Pod": POD, "Nodes": {"items": None}}))
    assert args.names == () and not args.cache_mode


def test_keys_match_case_insensitively_like_go() -> None:
    args = parse_extender_args(wire({"pod": POD, "nodenames": ["a"]}))
    assert args.pod == POD and args.names == ("a",)
    # An exact match wins over another case, whichever comes first.
    args = parse_extender_args(wire({"NodeNames": ["exact"], "nodeNames": ["other"]}))
    assert args.names == ("exact",)
    binding = parse_binding_args(
        wire({"podName": "p", "podNamespace": "ns", "podUID": "u", "node": "n"})
    )
    assert (binding.pod_name, binding.pod_namespace, binding.pod_uid, binding.node) == (
        "p",
        "ns",
        "u",
        "n",
    )
    assert (
        parse_binding_args(wire({"PODNAME": "p", "podnamespace": "ns", "PodUid": "u", "NODE": "n"}))
        == binding
    )


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        ({"Pod": POD}, ["ExtenderArgs", "NodeNames", "Nodes"]),
        ({"Pod": POD, "NodeNames": "a"}, ["ExtenderArgs", "Expected `array | null`", "NodeNames"]),
        ({"Pod": POD, "NodeNames": [1]}, ["Expected `str`", "$.NodeNames[0]"]),
        ({"Pod": POD, "Nodes": []}, ["Expected `object | null`", "$.Nodes"]),
        ({"Pod": POD, "Nodes": {"items": {}}}, ["$.Nodes.items"]),
        ({"Pod": POD, "Nodes": {"items": [{"metadata": {}}]}}, ["Nodes.items[0]", "metadata.name"]),
        ({"Pod": POD, "Nodes": {"items": [3]}}, ["Nodes.items[0]", "Node object"]),
        ({"Nodes": {"items": [{"metadata": {"name": 5}}]}}, ["Nodes.items[0]", "metadata.name"]),
        ([1, 2], ["ExtenderArgs must be a JSON object"]),
        (None, ["ExtenderArgs must be a JSON object"]),
    ],
)
def test_wrong_shapes_name_the_field(body: Any, fragments: list[str]) -> None:
    with pytest.raises(BadInput) as raised:
        parse_extender_args(wire(body))
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_not_json() -> None:
    with pytest.raises(BadInput, match="ExtenderArgs is not valid JSON"):
        parse_extender_args(b"{nope")


def test_binding_args_need_every_field_non_empty() -> None:
    with pytest.raises(BadInput, match=r"ExtenderBindingArgs.*`Node`"):
        parse_binding_args(wire({"PodName": "p", "PodNamespace": "ns", "PodUID": "u"}))
    with pytest.raises(BadInput, match=r"ExtenderBindingArgs.*PodUID"):
        parse_binding_args(wire({"PodName": "p", "PodNamespace": "ns", "PodUID": "", "Node": "n"}))
    with pytest.raises(BadInput, match=r"Expected `str`.*PodName"):
        parse_binding_args(wire({"PodName": 1, "PodNamespace": "ns", "PodUID": "u", "Node": "n"}))


def test_errors_never_echo_the_value() -> None:
    long = "x" * 5000
    with pytest.raises(BadInput) as raised:
        parse_binding_args(wire({"PodName": [long], "PodNamespace": "ns", "PodUID": "u"}))
    assert long not in str(raised.value)


def test_host_priority_list_and_binding_result() -> None:
    assert sent(host_priority_list({"a": 10, "b": 0})) == [
        {"Host": "a", "Score": 10},
        {"Host": "b", "Score": 0},
    ]
    assert sent(binding_result()) == {"Error": ""}
    assert sent(binding_result("no")) == {"Error": "no"}
    assert sent(error_filter_result(None, "bad")) == {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "bad",
    }


def test_a_large_non_cache_request_keeps_nodes_raw() -> None:
    items = [{"metadata": {"name": f"n-{i}"}, "status": {"x": i}} for i in range(2000)]
    args = parse_extender_args(wire({"Pod": POD, "Nodes": {"items": items}}))
    assert len(args.names) == 2000
    assert all(isinstance(i, msgspec.Raw) for i in args.items)
    assert sent(filter_result(args, ["n-7"]))["Nodes"]["items"] == [items[7]]
