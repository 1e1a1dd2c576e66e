"""Names no Kubernetes object can have, sent where a node or pod name goes.

Each gets the verb's own error (the extender's `Error` or `FailedNodes`, HTTP 400 for a body
not of the verb's shape, a refit refusal), never a 500; afterwards a valid /filter and a
refit that moves a reservation still succeed and every service is ready, i.e. none lost its
NATS connection (an over-long subject would make nats-server close it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import pytest

from shared import subjects
from tests.chaos.fuzzing import WHITESPACE_TOKENS
from tests.chaos.support import REFUSED, control_line_bytes, decodes_to_object, refit_body

if TYPE_CHECKING:
    from tests.chaos.hostile import Hostile

LONG_TOKEN = "n" * 4040
"""A refit subject of 4057 bytes: it fits nats-server's 4096-byte control line (with a short
reply subject) and reaches the service; its name cannot be a node's."""


async def filter_with(hostile: Hostile, names: list[str]) -> tuple[int, Any]:
    probe = await hostile.pod(hostile.filter_probe_uid)
    status, raw = await hostile.post("/filter", orjson.dumps({"Pod": probe, "NodeNames": names}))
    return status, orjson.loads(raw)


async def prioritize_with(hostile: Hostile, names: list[str]) -> tuple[int, Any]:
    probe = await hostile.pod(hostile.filter_probe_uid)
    status, raw = await hostile.post(
        "/prioritize", orjson.dumps({"Pod": probe, "NodeNames": names})
    )
    return status, orjson.loads(raw)


async def bind_with(
    hostile: Hostile, *, node: str, pod_name: str = "bind-probe"
) -> tuple[int, Any]:
    body = {
        "PodName": pod_name,
        "PodNamespace": "ml",
        "PodUID": hostile.bind_probe_uid,
        "Node": node,
    }
    status, raw = await hostile.post("/bind", orjson.dumps(body))
    return status, orjson.loads(raw)


def filter_refused(name: str, status: int, body: Any) -> bool:
    """The node is not kept, and the answer says why (Error, or the node in FailedNodes)."""
    if status == 400:
        return bool(body.get("Error"))
    failed = {**(body.get("FailedNodes") or {}), **(body.get("FailedAndUnresolvableNodes") or {})}
    return (
        status == 200
        and name not in (body.get("NodeNames") or [])
        and (bool(body.get("Error")) or bool(failed.get(name)))
    )


def prioritize_refused(name: str, status: int, body: Any) -> bool:
    """HostPriorityList has no error field: the node scores nothing (or the body is a 400)."""
    if status == 400:
        return isinstance(body, dict) and bool(body.get("Error"))
    return status == 200 and all(
        entry.get("Score") == 0 for entry in body if entry.get("Host") == name
    )


def bind_refused(status: int, body: Any) -> bool:
    return status in (200, 400) and bool(body.get("Error"))


CASES = [
    "filter-5000-char-node",
    "prioritize-5000-char-node",
    "bind-5000-char-node",
    "filter-node-with-a-space",
    "bind-tab-node",
    "bind-1-mib-pod-name",
    "refit-4040-char-subject-and-node",
]


async def run_case(hostile: Hostile, case: str) -> tuple[bool, Any]:
    """(whether the answer is the verb's own refusal, what came back)."""
    if case == "filter-5000-char-node":
        status, body = await filter_with(hostile, ["a" * 5000])
        return filter_refused("a" * 5000, status, body), (status, str(body)[:500])
    if case == "prioritize-5000-char-node":
        status, body = await prioritize_with(hostile, ["a" * 5000])
        return prioritize_refused("a" * 5000, status, body), (status, str(body)[:500])
    if case == "bind-5000-char-node":
        status, body = await bind_with(hostile, node="c" * 5000)
        return bind_refused(status, body), (status, str(body)[:500])
    if case == "filter-node-with-a-space":
        status, body = await filter_with(hostile, ["node 1"])
        return filter_refused("node 1", status, body), (status, str(body)[:500])
    if case == "bind-tab-node":
        status, body = await bind_with(hostile, node="\t")
        return bind_refused(status, body), (status, str(body)[:500])
    if case == "bind-1-mib-pod-name":
        status, body = await bind_with(hostile, node="node-1", pod_name="p" * (1 << 20))
        return bind_refused(status, body), (status, str(body)[:500])
    assert case == "refit-4040-char-subject-and-node"
    probe = await hostile.pod(hostile.refit_probe_uid)
    subject = f"{subjects.REFIT_PREFIX}.{LONG_TOKEN}"
    payload = orjson.dumps(refit_body(probe, ["GPU-b"], nodeName=LONG_TOKEN))
    assert control_line_bytes(subject, payload) < 4096
    outcome = await hostile.requester.request(subject, payload, wait=5)
    reply = decodes_to_object(outcome) if isinstance(outcome, bytes) else None
    refused = (
        reply is not None
        and reply.get("succeeded") is False
        and reply.get("code") in ("invalid_request", "node_unavailable", "pod_not_tracked")
        and bool(reply.get("failureReason"))
    )
    return refused, outcome if reply is None else reply


@pytest.mark.parametrize("case", CASES)
def test_an_impossible_name_gets_the_verbs_own_error(hostile: Hostile, case: str) -> None:
    refused, answer = hostile.run(run_case(hostile, case))
    # Afterwards the system works: no service lost NATS, a filter reserves, a refit moves.
    still = hostile.run(hostile.problems_serving())
    filter_status, filtered = hostile.run(hostile.filter_probe())
    moved = hostile.run(hostile.move_refit_probe())

    assert refused, f"{case}: not the verb's own refusal: {answer}"
    assert not still, f"{case}: afterwards {still}"
    assert filter_status == 200 and filtered.get("NodeNames") == ["node-1"], (case, filtered)
    assert moved.get("succeeded") is True and moved.get("code") == "moved", (case, moved)


@pytest.mark.parametrize("token", WHITESPACE_TOKENS)
@pytest.mark.parametrize("target", ["refit", "accounting"])
def test_a_subject_with_ascii_whitespace_leaves_the_connection_up(
    hostile: Hostile, target: str, token: str
) -> None:
    """nats-server delivers a subject token with a vertical tab or form feed; nats-py's
    protocol parser splits MSG lines on any ASCII whitespace, so an unprotected service
    meets a protocol error, drops its connection and loses its in-flight requests: one
    publish by anyone then silences every replica. It must answer (or at least keep serving:
    the next request answers at once, with no reconnect in between)."""
    if target == "refit":
        subject = f"{subjects.REFIT_PREFIX}.{token}"
        valid_subject = subjects.refit("node-1")
    else:
        subject = subjects.accounting_token("pending", token)
        valid_subject = subjects.accounting("pending", "node-1")

    async def probe() -> tuple[Any, Any]:
        hostile_outcome = await hostile.requester.request(subject, b'{"node": "x"}', wait=1)
        follow_up = await hostile.requester.request(valid_subject, b'{"node": "node-1"}', wait=1)
        return hostile_outcome, follow_up

    hostile_outcome, follow_up = hostile.run(probe())
    still = hostile.run(hostile.problems_serving())

    assert hostile_outcome != REFUSED  # the broker did deliver it
    assert isinstance(follow_up, bytes), (
        f"{target}: after a request on {subject!r} the next valid request got {follow_up}"
    )
    assert isinstance(hostile_outcome, bytes), f"{target}: {subject!r} got {hostile_outcome}"
    assert not still, still
