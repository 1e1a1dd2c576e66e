"""Nothing from a refit request becomes a subject (or a log line, or a reply text) unchecked.

Before the fix, a refit on `numafit.refit.v1.<4040 characters>` whose nodeName was that token
made svc_refit publish an accounting request with a subject over nats-server's 4096-byte
control line: the server closed the connection and nats-py never reconnects, so the service
answered nothing ever after. (With names checked in `shared.subjects` alone, the same request
was answered `api_error: internal error`.) Such requests are now `invalid_request` with a
bounded reason, and the service keeps answering.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import orjson
import pytest

from shared import subjects
from tests.integration.harness import harness
from tests.refit.helpers import raw_refit, request_for, still_serving, worked_objects

if TYPE_CHECKING:
    from pathlib import Path

LONG = "a" * 4040


async def test_a_4040_character_node_name_is_refused_and_the_service_keeps_answering(
    nats_url: str, tmp_path: Path
) -> None:
    async with harness(nats_url, tmp_path, worked_objects()) as h:
        created = await h.pod("ml", "train")
        body = request_for(created, nodeName=LONG)
        reply = await raw_refit(h, LONG, orjson.dumps(body))
        assert reply["succeeded"] is False
        assert reply["code"] == "invalid_request"
        assert len(reply["failureReason"]) < 300
        assert LONG not in reply["failureReason"]
        await still_serving(h, created)


@pytest.mark.parametrize(
    ("token", "node_name"),
    [
        (LONG, "node-1"),  # the subject is not a node's, whatever the body says
        ("a" * 254, "a" * 254),
        ("node-1", "a" * 4040),
        ("Node-1", "Node-1"),
        ("node-1", "node 1"),
        ("node-1", "node-1.*"),
        ("node-1", "node-1.>"),
        ("node-1", "-node"),
        ("node-1", "node\t1"),
        ("node-1", "ñode"),
    ],
)
async def test_names_that_are_not_node_names_are_invalid_requests(
    nats_url: str, tmp_path: Path, token: str, node_name: str
) -> None:
    async with harness(nats_url, tmp_path, worked_objects()) as h:
        created = await h.pod("ml", "train")
        before = h.accounting.ledger.nodes["node-1"].revision if h.accounting else None
        reply = await raw_refit(h, token, orjson.dumps(request_for(created, nodeName=node_name)))
        assert (reply["succeeded"], reply["code"]) == (False, "invalid_request"), reply
        assert len(reply["failureReason"]) < 300
        assert h.accounting is not None
        assert h.accounting.ledger.nodes["node-1"].revision == before
        await still_serving(h, created)


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("podName", "p" * 100_000, "invalid_request"),
        ("podNamespace", "ml ns", "invalid_request"),
        ("podNamespace", "n" * 100_000, "invalid_request"),
        ("podUID", "u" * 100_000, "invalid_request"),
        ("podUID", "uid with spaces", "invalid_request"),
        ("containerName", "c" * 100_000, "invalid_request"),
        ("deviceType", "D" * 100_000, "unknown_device_type"),
    ],
)
async def test_unbounded_fields_are_never_echoed(
    nats_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    field: str,
    value: str,
    code: str,
) -> None:
    async with harness(nats_url, tmp_path, worked_objects()) as h:
        created = await h.pod("ml", "train")
        with caplog.at_level(logging.DEBUG, logger="numafit"):
            reply = await h.refit_request(request_for(created, **{field: value}))
        assert (reply["succeeded"], reply["code"]) == (False, code), reply
        assert len(reply["failureReason"]) < 300
        if len(value) > 1000:  # long input is cut wherever it is echoed: logs, reply, events
            assert value[:200] not in reply["failureReason"]
            for record in caplog.records:
                text = record.getMessage() + " ".join(str(v) for v in record.__dict__.values())
                assert value[:200] not in text, record.getMessage()
        await still_serving(h, created)


async def test_a_name_with_dots_is_refused_on_another_nodes_subject(
    nats_url: str, tmp_path: Path
) -> None:
    async with harness(nats_url, tmp_path, worked_objects()) as h:
        created = await h.pod("ml", "train")
        reply = await raw_refit(
            h, subjects.node_token("gpu.node-7"), orjson.dumps(request_for(created))
        )
        assert reply["code"] == "unauthorized"
        await still_serving(h, created)
