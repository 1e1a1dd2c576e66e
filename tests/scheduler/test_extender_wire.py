"""kube-scheduler's extender wire shapes: Go field names, both nodeCacheCapable forms."""

from __future__ import annotations

from typing import Any

import pytest

from shared.wire import WireError
from svc_scheduler.extender_wire import (
    filter_result,
    host_priority_list,
    parse_binding_args,
    parse_extender_args,
)

POD: dict[str, Any] = {"metadata": {"name": "p", "uid": "u"}}


def test_cache_mode_names_in_names_out() -> None:
    args = parse_extender_args({"Pod": POD, "Nodes": None, "NodeNames": ["a", "b"]})
    assert args.cache_mode and args.names == ("a", "b")
    assert filter_result(args, ["b"], {"a": "1/1 CardInsufficientMemory"}) == {
        "Nodes": None,
        "NodeNames": ["b"],
        "FailedNodes": {"a": "1/1 CardInsufficientMemory"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_non_cache_mode_objects_in_objects_out() -> None:
    items = [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}, "spec": {}}]
    args = parse_extender_args({"Pod": POD, "Nodes": {"items": items}, "NodeNames": None})
    assert not args.cache_mode and args.names == ("a", "b")
    result = filter_result(args, ["b"])
    assert result["NodeNames"] is None
    assert result["Nodes"]["items"] == [items[1]]


def test_keys_match_case_insensitively_like_go() -> None:
    args = parse_extender_args({"pod": POD, "nodenames": ["a"]})
    assert args.pod == POD and args.names == ("a",)
    binding = parse_binding_args({"podName": "p", "podNamespace": "ns", "podUID": "u", "node": "n"})
    assert (binding.pod_name, binding.pod_namespace, binding.pod_uid, binding.node) == (
        "p",
        "ns",
        "u",
        "n",
    )


@pytest.mark.parametrize(
    "body",
    [
        {"Pod": POD},
        {"Pod": POD, "NodeNames": "a"},
        {"Pod": POD, "NodeNames": [1]},
        {"Pod": POD, "Nodes": []},
        {"Pod": POD, "Nodes": {"items": [{"metadata": {}}]}},
    ],
)
def test_wrong_shapes_are_wire_errors(body: dict[str, Any]) -> None:
    with pytest.raises(WireError):
        parse_extender_args(body)


def test_binding_args_need_every_field() -> None:
    with pytest.raises(WireError, match="Node"):
        parse_binding_args({"PodName": "p", "PodNamespace": "ns", "PodUID": "u"})


def test_host_priority_list() -> None:
    assert host_priority_list({"a": 10, "b": 0}) == [
        {"Host": "a", "Score": 10},
        {"Host": "b", "Score": 0},
    ]
