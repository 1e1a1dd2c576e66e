"""The read model's rules for usage updates: apply in order, or ask for a snapshot when an update
cannot describe the node completely (gap, new epoch, unknown node, other devices, unchanged
usage such as a cordon)."""

from __future__ import annotations

from typing import Any

from shared.core import codec
from shared.core.model import DeviceInfo
from svc_scheduler.read_model import ReadModel

GPU = DeviceInfo("GPU-a", 0, 10, 40000, 100, "NVIDIA A100", 0)


def snapshot_reply(epoch: str, revision: int, node: str = "node-1") -> dict[str, Any]:
    return {
        "ok": True,
        "epoch": epoch,
        "nodes": [
            {
                "node": node,
                "revision": revision,
                "devices": [codec.register_item(GPU)],
                "cordoned": [],
                "pods": [],
            }
        ],
    }


def usage(used: int, mem: int = 0, cores: int = 0) -> dict[str, Any]:
    return {"GPU-a": {"used": used, "usedmem": mem, "usedcores": cores}}


def model_at(revision: int = 3) -> ReadModel:
    model = ReadModel(None, None)  # type: ignore[arg-type]  # no I/O in these tests
    model._store(snapshot_reply("e1", revision), full=True)
    assert model.is_fresh("node-1")
    return model


def test_in_order_update_applies_without_a_snapshot() -> None:
    model = model_at(3)
    before = model.view("node-1")
    model.apply_update("e1", "node-1", 4, usage(1, 20000, 30))
    view = model.view("node-1")
    assert view is not None and view.revision == 4 and view.snapshot is not None
    assert view.snapshot.usage_table() == {"GPU-a": {"used": 1, "usedmem": 20000, "usedcores": 30}}
    assert model.is_fresh("node-1")
    # Views are immutable: a decision holding the old one keeps its (snapshot, revision).
    assert before is not None and before.revision == 3 and before.snapshot is not None
    assert before.snapshot.usage_table()["GPU-a"]["used"] == 0


def test_old_update_is_ignored() -> None:
    model = model_at(3)
    model.apply_update("e1", "node-1", 3, usage(5))
    model.apply_update("e1", "node-1", 2, usage(5))
    view = model.view("node-1")
    assert view is not None and view.revision == 3
    assert model.is_fresh("node-1")


def test_gap_marks_the_node_stale() -> None:
    model = model_at(3)
    model.apply_update("e1", "node-1", 5, usage(1))
    assert not model.is_fresh("node-1")


def test_unchanged_usage_marks_the_node_stale() -> None:
    # A cordon or register change bumps the revision without touching usage.
    model = model_at(3)
    model.apply_update("e1", "node-1", 4, usage(0))
    assert not model.is_fresh("node-1")


def test_other_device_set_or_malformed_table_marks_the_node_stale() -> None:
    for table in (
        {"GPU-b": {"used": 1, "usedmem": 0, "usedcores": 0}},
        {"GPU-a": {"used": "1"}},
        [],
    ):
        model = model_at(3)
        model.apply_update("e1", "node-1", 4, table)
        assert not model.is_fresh("node-1"), table


def test_unknown_node_and_new_epoch() -> None:
    model = model_at(3)
    model.apply_update("e1", "node-9", 1, usage(1))
    assert not model.is_fresh("node-9")
    model.apply_update("e2", "node-1", 1, usage(1))
    assert model._needs_full


def test_expected_revision_after_a_commit() -> None:
    model = model_at(3)
    model.expect("node-1", 5)
    assert not model.is_fresh("node-1")
    model.apply_update("e1", "node-1", 4, usage(1))
    assert not model.is_fresh("node-1")
    model.apply_update("e1", "node-1", 5, usage(2))
    assert model.is_fresh("node-1")


def test_a_snapshot_never_rolls_back_a_newer_update() -> None:
    model = model_at(3)
    model.apply_update("e1", "node-1", 4, usage(1))
    model._store(snapshot_reply("e1", 3), full=False)
    view = model.view("node-1")
    assert view is not None and view.revision == 4
    model._store(snapshot_reply("e1", 3), full=True)
    view = model.view("node-1")
    assert view is not None and view.revision == 4


def test_updates_before_the_first_snapshot_are_ignored() -> None:
    model = ReadModel(None, None)  # type: ignore[arg-type]
    model.apply_update("e1", "node-1", 1, usage(1))
    assert model.view("node-1") is None


def test_a_deleted_node_is_dropped() -> None:
    model = model_at(3)
    model.expect("node-1", 4)
    model.apply_update("e1", "node-1", 4, {}, deleted=True)
    assert model.view("node-1") is None
    assert not model._needs_fetch("node-1")  # gone, not stale: no snapshot is asked for it
    assert model.metrics.registry.get_sample_value("numafit_scheduler_read_model_nodes") == 0


def test_names_nobody_announced_are_absent_not_stale() -> None:
    model = model_at(3)
    # A filter naming made-up nodes asks accounting nothing about them...
    assert not model._needs_fetch("made-up-1")
    # ...until accounting announces the node (a Node created after the last snapshot).
    model.apply_update("e1", "node-2", 1, usage(0))
    assert model._needs_fetch("node-2")
    # An update naming something that is no node name is ignored.
    model.apply_update("e1", "x" * 300, 1, usage(0))
    assert not model._needs_fetch("x" * 300)
