"""Allocate while accounting does not answer its consume: the container's devices were decided
when GetPreferredAllocation fetched the pending entry, so kubelet is answered from it, the
consumption is journalled and sent again until accounting acknowledges it (after a plugin
restart too). Without a fetched entry Allocate fails, saying why.

Accounting and the refit service are the fakes of `test_deadlines` on a real nats-server; the
last test runs the real accounting to check that a consume sent again is answered `ok`.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import orjson
import pytest

from shared.core import keys
from svc_deviceplugin.config import JOURNAL_FILE
from tests.deviceplugin.stack import gpu_pod, node_stack
from tests.deviceplugin.test_deadlines import (
    CONSUMED,
    MARGIN,
    PENDING_POD,
    SILENT,
    Fake,
    Node,
    allocate,
    direct_stub,
    fake_node,
)
from tests.integration.harness import wait_for
from tests.metrics import sample

if TYPE_CHECKING:
    from collections.abc import Iterator

BUDGET_MS = 1000
LOCAL_POD = {
    **PENDING_POD,
    "numaAlignment": "best-effort",
    # Reserved on GPU-b, which kubelet offers: no mismatch, no refit.
    "entries": [{"index": 0, "containerName": "main", "devices": "GPU-b,NVIDIA,20000,30:"}],
}
PENDING = {"ok": True, "code": "ok", "pod": LOCAL_POD}
NODE_UNAVAILABLE = {
    "ok": False,
    "code": "node_unavailable",
    "error": "no accounting replica serves node deadline-node yet: a takeover is under way",
}


@pytest.fixture
def state_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="nf-state-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def metric(node: Node, name: str, **labels: str) -> float:
    return sample(node.plugin.metrics.registry, name, **labels)


def journal_entries(node: Node) -> float:
    return metric(node, "numafit_deviceplugin_consume_journal_entries")


def journal_file(state_dir: Path) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = orjson.loads((state_dir / JOURNAL_FILE).read_bytes())["entries"]
    return entries


def answer_consumes(fake: Fake, reply: dict[str, Any] = CONSUMED) -> None:
    """Accounting is back: consumes are answered from now on."""
    fake.replies["consume"] = [reply]
    fake.delays["consume"] = 0.0


async def test_allocate_is_answered_when_consume_gets_no_answer(
    nats_url: str, state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: `cannot record the allocation: accounting did not answer ... consume` and the
    # pod failed for good (kubelet does not retry Allocate).
    async with fake_node(
        nats_url,
        BUDGET_MS,
        replies={"pending": [PENDING]},
        delays={"consume": SILENT},
        state_dir=state_dir,
    ) as node:
        _, answer, error = await node.preferred()
        assert error is None and answer and answer[0].startswith("GPU-b-")
        with caplog.at_level(logging.INFO, logger="numafit.deviceplugin"):
            elapsed, response, refused = await node.allocate(["GPU-b-3"])
            assert refused is None, refused.details()
            assert elapsed <= BUDGET_MS / 1000 + MARGIN
            envs = response.container_responses[0].envs
            assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
            assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20000m"
            assert envs["CUDA_DEVICE_SM_LIMIT"] == "30"
            assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/tmp/vgpu/uid-1_main.cache"
            assert node.allocations("ok") == 1
            deferred = "numafit_deviceplugin_consume_deferred_total"
            assert metric(node, deferred, reason="accounting_unavailable") == 1
            assert journal_entries(node) == 1
            # On disk before kubelet had its answer.
            (record,) = journal_file(state_dir)
            assert record["podUID"] == "uid-1" and record["containerIndex"] == 0
            assert record["devices"] == ["GPU-b"]
            assert record["containerDevices"] == "GPU-b,NVIDIA,20000,30:"
            # Until accounting records it, the entry is not offered to kubelet again: the
            # answer is no reservation's, only distinct GPUs among those offered.
            pending_asked = len(node.fake.requests["pending"])
            _, again, _ = await node.preferred()
            assert again == ["GPU-b-0"]
            assert len(node.fake.requests["pending"]) == pending_asked + 1
            preferences = "numafit_deviceplugin_preferences_total"
            assert metric(node, preferences, source="reservation") == 1  # the first call's

            answer_consumes(node.fake)
            await wait_for(lambda: journal_entries(node) == 0, within=10)
        replays = "numafit_deviceplugin_consume_replays_total"
        assert metric(node, replays, result="recorded") == 1
        assert metric(node, replays, result="dropped") == 0
        assert journal_file(state_dir) == []
        # Sent again naming the pod and container: the node's pending pod may be another.
        last = node.fake.requests["consume"][-1]
        assert last["podUID"] == "uid-1" and last["containerIndex"] == 0
        assert last["devices"] == ["GPU-b"]
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("consume deferred") for m in messages)
    assert "deferred consume recorded by accounting" in messages


async def test_node_unavailable_during_a_takeover_is_deferred(
    nats_url: str, state_dir: Path
) -> None:
    async with fake_node(
        nats_url,
        BUDGET_MS,
        replies={"pending": [PENDING], "consume": [NODE_UNAVAILABLE]},
        state_dir=state_dir,
    ) as node:
        await node.preferred()
        _, response, refused = await node.allocate(["GPU-b-0"])
        assert refused is None, refused.details()
        assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
        deferred = "numafit_deviceplugin_consume_deferred_total"
        assert metric(node, deferred, reason="node_unavailable") == 1
        answer_consumes(node.fake)
        await wait_for(lambda: journal_entries(node) == 0, within=10)


async def test_kubelets_other_gpu_keeps_the_reserved_amounts(
    nats_url: str, state_dir: Path
) -> None:
    # kubelet gave GPU-a (its choice after a fallback): the amounts follow, as accounting's
    # consume records them.
    async with fake_node(
        nats_url,
        BUDGET_MS,
        replies={"pending": [PENDING]},
        delays={"consume": SILENT},
        state_dir=state_dir,
    ) as node:
        await node.preferred()
        _, response, refused = await node.allocate(["GPU-a-1"])
        assert refused is None, refused.details()
        envs = response.container_responses[0].envs
        assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20000m"
        (record,) = journal_file(state_dir)
        assert record["devices"] == ["GPU-a"]
        assert record["containerDevices"] == "GPU-a,NVIDIA,20000,30:"


async def test_a_refits_move_is_what_allocate_answers(nats_url: str, state_dir: Path) -> None:
    moved = {"succeeded": True, "code": "moved", "containerDevices": "GPU-b,NVIDIA,20000,30:"}
    async with fake_node(
        nats_url,
        BUDGET_MS,
        replies={"refit": [moved]},  # PENDING_POD: reserved on GPU-a, kubelet offers GPU-b
        delays={"consume": SILENT},
        state_dir=state_dir,
    ) as node:
        _, answer, error = await node.preferred()
        assert error is None and answer and answer[0].startswith("GPU-b-")
        _, response, refused = await node.allocate(answer)
        assert refused is None, refused.details()
        assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"


async def test_the_next_container_is_not_confused_with_an_unrecorded_one(
    nats_url: str, state_dir: Path
) -> None:
    # Two containers; accounting does not record the first one's consume, and its `pending`
    # still shows both entries: the second Allocate must be for the second entry, named.
    side = {"index": 1, "containerName": "side", "devices": "GPU-b,NVIDIA,10000,20:"}
    two = {**LOCAL_POD, "entries": [*LOCAL_POD["entries"], side]}
    async with fake_node(
        nats_url,
        BUDGET_MS,
        replies={"pending": [{"ok": True, "code": "ok", "pod": two}]},
        delays={"consume": SILENT},
        state_dir=state_dir,
    ) as node:
        for expected in ("20000m", "10000m"):
            await node.preferred()
            _, response, refused = await node.allocate(["GPU-b-0"])
            assert refused is None, refused.details()
            envs = response.container_responses[0].envs
            assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == expected
        named = [r for r in node.fake.requests["consume"] if r.get("containerIndex") == 1]
        assert named and named[0]["podUID"] == "uid-1"
        assert [(r["containerIndex"], r["containerName"]) for r in journal_file(state_dir)] == [
            (0, "main"),
            (1, "side"),
        ]
        answer_consumes(node.fake)
        await wait_for(lambda: journal_entries(node) == 0, within=10)


async def test_without_a_fetched_entry_allocate_fails_clearly(nats_url: str) -> None:
    # kubelet skipped GetPreferredAllocation: the plugin does not know the container's entry.
    async with fake_node(nats_url, BUDGET_MS, delays={"consume": SILENT}) as node:
        _, _, refused = await node.allocate(["GPU-b-0"])
        assert refused is not None and refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = str(refused.details())
        assert details.startswith("cannot record the allocation: accounting did not answer")
        assert "GetPreferredAllocation fetched no entry" in details
        assert node.allocations("accounting_unavailable") == 1
        assert journal_entries(node) == 0


async def test_the_journal_is_replayed_after_a_plugin_restart(
    nats_url: str, state_dir: Path
) -> None:
    fake = Fake(replies={"pending": [PENDING]}, delays={"consume": SILENT})
    async with fake_node(nats_url, BUDGET_MS, fake=fake, state_dir=state_dir) as node:
        await node.preferred()
        _, _, refused = await node.allocate(["GPU-b-0"])
        assert refused is None, refused.details()
    assert len(journal_file(state_dir)) == 1  # the plugin stopped before accounting answered
    answer_consumes(fake)
    fake.requests["consume"].clear()
    async with fake_node(nats_url, BUDGET_MS, fake=fake, state_dir=state_dir) as restarted:
        await wait_for(lambda: journal_entries(restarted) == 0, within=10)
        (replayed,) = fake.requests["consume"]
        assert replayed["podUID"] == "uid-1" and replayed["containerIndex"] == 0
    assert journal_file(state_dir) == []


async def test_a_refusal_for_good_drops_the_record(nats_url: str, state_dir: Path) -> None:
    gone = {"ok": False, "code": "pod_not_tracked", "error": "pod uid-1 is not tracked"}
    async with fake_node(
        nats_url,
        BUDGET_MS,
        replies={"pending": [PENDING]},
        delays={"consume": SILENT},
        state_dir=state_dir,
    ) as node:
        await node.preferred()
        _, _, refused = await node.allocate(["GPU-b-0"])
        assert refused is None, refused.details()
        answer_consumes(node.fake, gone)
        await wait_for(lambda: journal_entries(node) == 0, within=10)
        replays = "numafit_deviceplugin_consume_replays_total"
        assert metric(node, replays, result="dropped") == 1


# --- the real accounting ---------------------------------------------------------------------


async def test_accounting_answers_a_consume_sent_again_ok(nats_url: str, tmp_path: Path) -> None:
    # Before: the second consume was refused (`invalid_request`: no pending entry), so a
    # consume whose answer was lost could never be acknowledged.
    pods = [gpu_pod("local", "GPU-b,NVIDIA,20000,30:;")]
    async with node_stack(nats_url, tmp_path, pods) as stack:
        uid = await stack.uid("local")
        client = stack.h.client
        body = {"devices": ["GPU-b"], "podUID": uid, "containerIndex": 0}
        first = await client.call("consume", "node-1", body)
        assert first["ok"], first
        written = (await stack.h.pod("ml", "local"))["metadata"]
        again = await client.call("consume", "node-1", body)
        assert again["ok"], again
        assert again["containerDevices"] == first["containerDevices"] == "GPU-b,NVIDIA,20000,30:"
        after = (await stack.h.pod("ml", "local"))["metadata"]
        assert after["resourceVersion"] == written["resourceVersion"]  # nothing written again
        assert after["annotations"][keys.TO_ALLOCATE] == ";"
        assert after["annotations"][keys.BIND_PHASE] == keys.PHASE_SUCCESS
        # Other GPUs than the entry runs on are still refused: that is no repeat.
        other = await client.call("consume", "node-1", {**body, "devices": ["GPU-a"]})
        assert not other["ok"] and other["code"] == "invalid_request"
        async with direct_stub(stack) as stub:
            _, _, refused = await allocate(stub, ["GPU-b-0"])
        assert refused is not None  # nothing pending any more: a fresh Allocate is refused
