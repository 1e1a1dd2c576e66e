"""A reply lost to a broken connection loses only the reply.

nats-py can raise the `OSError` of a socket that breaks under a publish (shared/service/
natsconn.py); when that publish is a service's reply, the work the request did stands. Before
this was handled, accounting took a committed move for an internal error: counted
`internal_error`, a second "internal error" reply attempted, and the change never published to
the readers (whose view of the node then stayed behind until its next change). The refit
likewise counted a decision it had made as `api_error`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import pytest

from shared import subjects
from shared.accounting_client import AccountingUnavailable
from shared.core import keys
from tests.builders import refit_request
from tests.integration.harness import harness, wait_for
from tests.integration.test_refit_answer import Inbox, _move, one_pod_objects
from tests.metrics import refit_counter, sample

if TYPE_CHECKING:
    from pathlib import Path

    from nats.aio.client import Client


def break_publishes_to(monkeypatch: pytest.MonkeyPatch, nc: Client, prefix: str) -> None:
    """Every publish of `nc` to a subject under `prefix` fails as a reset socket does."""
    real_publish = nc.publish

    async def breaks(subject: str, *args: Any, **kwargs: Any) -> None:
        if subject.startswith(prefix):
            raise ConnectionResetError("Connection lost")
        await real_publish(subject, *args, **kwargs)

    monkeypatch.setattr(nc, "publish", breaks)


async def test_a_move_whose_reply_is_lost_still_lands_and_is_published(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with harness(nats_url, tmp_path, one_pod_objects(), with_refit=False) as h:
        created = await h.pod("ml", "infer")
        assert h.accounting is not None and h.client_nc is not None
        registry = h.accounting.metrics.registry
        revision = (await h.client.snapshot("node-1"))["nodes"][0]["revision"]
        updates: list[dict[str, Any]] = []

        async def keep(msg: Any) -> None:
            updates.append(orjson.loads(msg.data))

        await h.client_nc.subscribe(subjects.usage("node-1"), cb=keep)
        await h.client_nc.flush()
        # The client's replies come to its inboxes; usage updates still go out.
        break_publishes_to(monkeypatch, h.accounting.nc, "_INBOX")
        with pytest.raises(AccountingUnavailable):
            await h.client.call("move", "node-1", _move(created, revision), budget=0.5)

        await wait_for(lambda: any(u["revision"] > revision for u in updates))
        assert sample(registry, "numafit_accounting_replies_lost_total") == 1
        assert sample(registry, "numafit_accounting_commits_total", op="move", result="ok") == 1
        assert (
            sample(registry, "numafit_accounting_commits_total", op="move", result="internal_error")
            == 0
        )
        monkeypatch.undo()
        after = (await h.client.snapshot("node-1"))["nodes"][0]
        assert after["revision"] == max(u["revision"] for u in updates)
        annotations = (await h.pod("ml", "infer"))["metadata"]["annotations"]
        assert annotations[keys.ALLOCATED] == "GPU-b,NVIDIA,10000,10:;"


async def test_a_refit_whose_reply_is_lost_counts_its_decision(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with harness(nats_url, tmp_path, one_pod_objects()) as h:
        created = await h.pod("ml", "infer")
        assert h.refit is not None and h.client_nc is not None
        inbox = await Inbox(h).open()
        break_publishes_to(monkeypatch, h.refit.nc, inbox.prefix)
        # Already on GPU-a: the refit answers this itself, without accounting.
        body = orjson.dumps(refit_request(created, 0, ["GPU-a"]))
        await h.client_nc.publish(subjects.refit("node-1"), body, reply=f"{inbox.prefix}.1")

        await wait_for(lambda: refit_counter(h.refit, "replies_lost") == 1)
        assert refit_counter(h.refit, "requests", code="already_aligned", mode="best-effort") == 1
        assert refit_counter(h.refit, "requests", code="api_error", mode="best-effort") == 0
        monkeypatch.undo()
        # The refit answers the next request as usual.
        answer = await inbox.ask(refit_request(created, 0, ["GPU-a"]))
        assert answer["code"] == "already_aligned"
