"""The fencing rules of accounting's single writer, one at a time, on a real nats-server.

A request carries the epoch of the view it was decided on and an absolute deadline; accounting
acts on it only in that epoch and before that deadline (also when the request was read late,
or waited for the node), and otherwise refuses it with nothing changed.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

from shared.accounting_client import AccountingUnavailable
from tests.builders import container, pod
from tests.integration.harness import harness, wait_for
from tests.integration.test_accounting_reliability import (
    objects,
    placed,
    pod_annotations,
    revision,
    uid_rv,
)
from tests.integration.test_refit_over_nats import for_create

if TYPE_CHECKING:
    from pathlib import Path

    from tests.integration.harness import Harness

TARGET = "GPU-b,NVIDIA,20000,0:;"


async def move_of(h: Harness, name: str) -> dict[str, object]:
    uid, _ = await uid_rv(h, name)
    return {
        "podUID": uid,
        "revision": await revision(h),
        "containerIndex": 0,
        "toAllocate": TARGET,
        "allocated": TARGET,
    }


async def test_a_move_decided_in_another_epoch_is_refused_with_conflict(
    nats_url: str, tmp_path: Path
) -> None:
    """A revision counts only in its epoch: one read under another owner (or an earlier run)
    says nothing about this ledger, even when the numbers happen to match."""
    async with harness(
        nats_url, tmp_path, objects(placed("mover", "GPU-a,NVIDIA,20000,0:;")), with_refit=False
    ) as h:
        before = await pod_annotations(h, "ml", "mover")
        move = await move_of(h, "mover")
        reply = await h.client.call("move", "node-1", {**move, "epoch": "another-owner.0.1"})
        assert (reply["ok"], reply["code"]) == (False, "conflict"), reply
        assert "epoch" in reply["error"]
        assert await pod_annotations(h, "ml", "mover") == before
        # The same move in the ledger's own epoch lands.
        reply = await h.client.call("move", "node-1", {**move, "epoch": reply["epoch"]})
        assert reply["ok"], reply


async def test_a_request_past_its_absolute_deadline_changes_nothing(
    nats_url: str, tmp_path: Path
) -> None:
    """`deadlineAtMs` is the caller's own deadline: a request read after it (a paused replica
    reads its socket late, and `deadlineMs` alone would look fresh) changes nothing and gets
    no answer (its caller gave up; another replica may have answered it meanwhile), and it is
    counted."""
    async with harness(
        nats_url, tmp_path, objects(placed("mover", "GPU-a,NVIDIA,20000,0:;")), with_refit=False
    ) as h:
        assert h.accounting is not None
        registry = h.accounting.metrics.registry
        before = await pod_annotations(h, "ml", "mover")
        move = await move_of(h, "mover")
        gone = int(time.time() * 1000) - 500
        with pytest.raises(AccountingUnavailable):
            await h.client.call("move", "node-1", {**move, "deadlineAtMs": gone}, 1.0)
        assert await pod_annotations(h, "ml", "mover") == before
        reserve = {
            "podUID": "uid-nobody",
            "podNamespace": "ml",
            "podName": "nobody",
            "revision": await revision(h),
            "allocated": TARGET,
            "deadlineAtMs": gone,
        }
        with pytest.raises(AccountingUnavailable):
            await h.client.call("reserve", "node-1", reserve, 1.0)
        late = registry.get_sample_value("numafit_accounting_late_requests_total")
        assert late == 2, late
        # The same requests within their deadline are served (the node and pod are fine).
        fresh = int(time.time() * 1000) + 5000
        reply = await h.client.call("move", "node-1", {**move, "deadlineAtMs": fresh})
        assert reply["ok"], reply


async def test_a_request_waiting_for_a_busy_node_is_not_served_after_its_deadline(
    nats_url: str, tmp_path: Path
) -> None:
    """The node's lock is waited for no longer than the request's deadline: a reserve that
    queued behind a slow write is refused once its caller has given up, not held (before the
    fix it was held, after its deadline, for a filter that had long moved on)."""
    later = pod("later", containers=[container("app", 1, 10000)], namespace="ml", node_name="")
    async with harness(
        nats_url,
        tmp_path,
        [*objects(placed("slow", "GPU-a,NVIDIA,20000,0:;")), ("pod", for_create(later))],
        with_refit=False,
    ) as h:
        # The slow move's PATCH is held 0.6 s and then refused: the node's revision stays.
        rule = h.emulator.faults.add(
            method="PATCH", path_regex=r"/pods/slow$", delay_s=0.6, status=500, times=1
        )
        slow = asyncio.ensure_future(h.client.call("move", "node-1", await move_of(h, "slow"), 2.0))
        await wait_for(lambda: rule.hits == 1)
        uid, _ = await uid_rv(h, "later")
        reserve = {
            "podUID": uid,
            "podNamespace": "ml",
            "podName": "later",
            "revision": await revision(h),
            "allocated": "GPU-b,NVIDIA,10000,0:;",
        }
        reply = await h.client.call("reserve", "node-1", reserve, 0.3, margin=0.05)
        assert reply["code"] == "deadline_exceeded", reply
        assert (await slow)["code"] == "api_error"
        snapshot = await h.client.snapshot("node-1", pod_uid=uid)
        assert snapshot["pod"] is None, snapshot["pod"]


async def test_a_bind_phase_naming_another_pod_than_its_uid_touches_nothing(
    nats_url: str, tmp_path: Path
) -> None:
    """A bind whose pod name and UID disagree must not mark the reservation of the pod that
    owns the UID (before the fix `failed` released that pod's hold)."""
    owner = pod("owner", containers=[container("app", 1, 10000)], namespace="ml", node_name="")
    async with harness(
        nats_url, tmp_path, [*objects(), ("pod", for_create(owner))], with_refit=False
    ) as h:
        uid, _ = await uid_rv(h, "owner")
        reserve = {
            "podUID": uid,
            "podNamespace": "ml",
            "podName": "owner",
            "revision": await revision(h),
            "allocated": "GPU-b,NVIDIA,10000,0:;",
        }
        assert (await h.client.call("reserve", "node-1", reserve))["ok"]
        body = {"podUID": uid, "phase": "failed", "podNamespace": "ml", "podName": "intruder"}
        reply = await h.client.call("bind-phase", "node-1", body)
        assert (reply["ok"], reply["code"]) == (False, "pod_mismatch"), reply
        held = await h.client.snapshot("node-1", pod_uid=uid)
        assert held["pod"] is not None, "the owner's hold was released"
