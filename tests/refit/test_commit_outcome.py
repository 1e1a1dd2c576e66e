"""A refit reply never says failure for a commit that landed when the service can know it did.

Before the fix, a move whose answer did not get home (lost, or later than the refit waited)
was answered `deadline_exceeded` although the reservation had moved: the device plugin then
fell back while the ledger and the annotations said the container was on the allowed GPU. Now
accounting is given less time than the refit waits (so its success answer gets home), and an
unanswered or inconclusive move is checked against accounting's ledger before replying.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from shared.accounting_client import AccountingUnavailable
from shared.core import keys
from shared.messages import MoveRequest
from tests.integration.harness import harness, wait_for
from tests.metrics import refit_counter
from tests.refit.helpers import request_for, worked_objects

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

MOVED_PENDING = ";GPU-b,NVIDIA,20000,30:;"  # the worked example's answer (docs/reference/plan.md)


async def test_a_move_whose_answer_is_lost_is_reported_moved_when_it_landed(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with harness(nats_url, tmp_path, worked_objects()) as h:
        created = await h.pod("ml", "train")
        assert h.refit is not None
        real = h.refit.accounting.ask

        async def answer_lost(request: Any, *args: Any, **kw: Any) -> Any:
            reply = await real(request, *args, **kw)
            if isinstance(request, MoveRequest):
                raise AccountingUnavailable("the answer was lost on its way back")
            return reply

        monkeypatch.setattr(h.refit.accounting, "ask", answer_lost)
        reply = await h.refit_request(request_for(created))
        assert reply == {
            "succeeded": True,
            "code": "moved",
            "containerDevices": "GPU-b,NVIDIA,20000,30:",
        }
        stored = (await h.pod("ml", "train"))["metadata"]["annotations"]
        assert stored[keys.TO_ALLOCATE] == MOVED_PENDING
        # Accounting answered the requester itself; the refit, whose copy of the answer was
        # lost, checks that the move landed and says so (`moved`, the same answer) after it.
        refit = h.refit
        await wait_for(lambda: refit_counter(refit, "uncertain_commits", outcome="landed") == 1)


async def test_a_move_that_did_not_land_is_not_reported_moved(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with harness(nats_url, tmp_path, worked_objects()) as h:
        created = await h.pod("ml", "train")
        assert h.refit is not None

        async def never_answers(*_: Any, **__: Any) -> Any:
            raise AccountingUnavailable("no answer")

        real = h.refit.accounting.ask

        async def move_lost(request: Any, *args: Any, **kw: Any) -> Any:
            if isinstance(request, MoveRequest):
                return await never_answers()
            return await real(request, *args, **kw)

        monkeypatch.setattr(h.refit.accounting, "ask", move_lost)
        reply = await h.refit_request(request_for(created))
        assert (reply["succeeded"], reply["code"]) == (False, "deadline_exceeded")
        stored = (await h.pod("ml", "train"))["metadata"]["annotations"]
        assert stored == created["metadata"]["annotations"]
        assert refit_counter(h.refit, "uncertain_commits", outcome="not_landed") == 1


async def test_a_write_that_outlives_accountings_deadline_is_fenced_and_never_lands(
    nats_url: str, tmp_path: Path
) -> None:
    """The move's PATCH takes longer than accounting may wait for it, and the API server would
    commit it after accounting gave up (a client-side timeout). Accounting settles it first: a
    guarded write of its own at the same resourceVersion, so the late one fails its
    precondition. The reply says it did not land, and it never does."""
    async with harness(nats_url, tmp_path, worked_objects()) as h:
        created = await h.pod("ml", "train")
        h.emulator.faults.add(
            method="PATCH", path_regex=r"/pods/train$", delay_s=0.85, times=1, outlive_client=True
        )
        started = time.perf_counter()
        reply = await h.refit_request(request_for(created, timeoutMs=1000))
        elapsed = time.perf_counter() - started
        assert reply["code"] == "deadline_exceeded", reply
        assert "never will" in reply["failureReason"], reply
        assert elapsed < 1.0
        assert h.refit is not None
        assert refit_counter(h.refit, "commit_attempts", result="deadline_exceeded") == 1
        # The held PATCH has been served by now: refused (409), not committed.
        await wait_for(lambda: h.emulator.faults.in_flight == 0, within=5)
        stored = (await h.pod("ml", "train"))["metadata"]["annotations"]
        before = created["metadata"]["annotations"]
        assert stored[keys.TO_ALLOCATE] == before[keys.TO_ALLOCATE]
        assert stored[keys.ALLOCATED] == before[keys.ALLOCATED]
        assert keys.WRITE_FENCE in stored
