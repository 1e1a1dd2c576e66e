"""Replica selection of reference (h)."""

from __future__ import annotations

import pytest

from shared.core.replicas import ReplicaMismatch, SelectionError, replica_ids, select_replicas

KNOWN = frozenset({"GPU-a", "GPU-b", "GPU-c"})


def test_replica_ids() -> None:
    assert replica_ids("GPU-a", 3) == ["GPU-a-0", "GPU-a-1", "GPU-a-2"]


def test_one_replica_per_reserved_gpu_in_available_order() -> None:
    available = ["GPU-b-3", "GPU-a-0", "GPU-a-1", "GPU-b-4"]
    assert select_replicas(available, [], ["GPU-b"], 1, KNOWN) == ["GPU-b-3"]
    assert select_replicas(available, [], ["GPU-a", "GPU-b"], 2, KNOWN) == ["GPU-a-0", "GPU-b-3"]


def test_must_include_replicas_serve_their_gpu() -> None:
    available = ["GPU-a-0", "GPU-a-1", "GPU-b-0"]
    assert select_replicas(available, ["GPU-a-1"], ["GPU-a", "GPU-b"], 2, KNOWN) == [
        "GPU-a-1",
        "GPU-b-0",
    ]


def test_missing_gpu_is_the_typed_mismatch() -> None:
    with pytest.raises(ReplicaMismatch, match="annotated GPU GPU-a") as info:
        select_replicas(["GPU-b-0"], [], ["GPU-a"], 1, KNOWN)
    assert info.value.uuid == "GPU-a"


def test_too_few_reserved_devices_is_not_a_mismatch() -> None:
    with pytest.raises(SelectionError, match="smaller than requested allocation size 2") as info:
        select_replicas(["GPU-a-0", "GPU-b-0"], [], ["GPU-a"], 2, KNOWN)
    assert not isinstance(info.value, ReplicaMismatch)


def test_more_must_include_than_size_is_refused() -> None:
    with pytest.raises(SelectionError, match="selection has 2 devices, need 1"):
        select_replicas(["GPU-a-0", "GPU-b-0"], ["GPU-a-0", "GPU-b-0"], ["GPU-a"], 1, KNOWN)


def test_hami_uuids_map_without_a_known_set() -> None:
    uuid = "GPU-12345678-1234-1234-1234-123456789abc"
    assert select_replicas([f"{uuid}-7"], [], [uuid], 1) == [f"{uuid}-7"]
