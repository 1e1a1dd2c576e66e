"""Malformed refits never crash or wedge svc_refit (property test over a real nats-server).

Random refit bodies (not JSON, not objects, fields of every type, the real pod's identity mixed
with garbage) on random subject tokens, against the in-process accounting and refit services:
every one is answered `succeeded: false` with a refit reply code, nothing in the ledger or on the
API server changes, and a valid refit is still answered (and moves) afterwards.
"""

from __future__ import annotations

import asyncio
import json
import string
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.design import DESIGN_REFIT_FAILURES
from tests.integration.harness import Harness, harness
from tests.refit.helpers import raw_refit, still_serving, worked_objects

if TYPE_CHECKING:
    from pathlib import Path

PAST_THE_POD = {
    "node_mismatch",
    "pod_mismatch",
    "container_out_of_range",
    "container_name_mismatch",
    "nothing_pending",
    "no_fit",
}
MOVABLE = {"GPU-a", "GPU-b"}  # naming either could make a valid refit succeed

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
names = st.text(alphabet=string.ascii_letters + string.digits + "-._ *>\t/ñ", max_size=30)
long_text = st.integers(min_value=254, max_value=5000).map(lambda n: "x" * n)


def encode(value: Any) -> bytes:
    """Any JSON value, integers beyond 64 bits included (orjson refuses to write those)."""
    return json.dumps(value).encode()


garbage = names | long_text | json_values


@st.composite
def mutated_refits(draw: st.DrawFn, uid: str) -> dict[str, Any]:
    """The real pod's refit (for GPUs it cannot move to) with a few fields replaced by
    neighbours or garbage, or dropped: the paths past the first checks get exercised."""
    body: dict[str, Any] = {
        "podUID": uid,
        "podNamespace": "ml",
        "podName": "train",
        "nodeName": "node-1",
        "containerIndex": draw(st.integers(-1, 3)),
        "containerName": draw(st.sampled_from(["main", "prep", ""])),
        "deviceType": "NVIDIA",
        "allowedDeviceUUIDs": draw(
            st.lists(names.filter(lambda u: u not in MOVABLE), min_size=1, max_size=5)
        ),
        "mode": draw(st.sampled_from(["best-effort", "strict"])),
        "timeoutMs": draw(st.integers(1, 3000)),
    }
    neighbours: dict[str, list[Any]] = {
        "podUID": ["no-such-pod", uid.upper()],
        "podNamespace": ["default"],
        "podName": ["other"],
        "nodeName": ["node-2"],
        "containerIndex": [2**62, -(2**62)],
        "containerName": ["other"],
        "deviceType": ["MLU", "AMD", "nvidia"],
        "allowedDeviceUUIDs": [[], ["x"] * 600],
        "mode": ["none", "Strict"],
        "timeoutMs": [0, -1, 60_001],
    }
    for key in draw(st.lists(st.sampled_from(sorted(body)), max_size=3, unique=True)):
        choice = draw(st.integers(0, 2))
        if choice == 0:
            del body[key]
        elif choice == 1:
            body[key] = draw(st.sampled_from(neighbours[key]))
        else:
            body[key] = draw(garbage)
    if draw(st.booleans()):
        body[draw(st.text(max_size=8))] = draw(json_values)
    return body


def field(*valid: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from(valid) | garbage


def refit_bodies(uid: str) -> st.SearchStrategy[dict[str, Any]]:
    allowed = st.lists(names.filter(lambda u: u not in MOVABLE), max_size=5) | json_values
    return st.fixed_dictionaries(
        {},
        optional={
            "podUID": field(uid, "no-such-pod"),
            "podNamespace": field("ml", "default"),
            "podName": field("train", "other"),
            "nodeName": field("node-1", "node-2"),
            "containerIndex": st.integers(-3, 5) | st.integers() | json_values,
            "containerName": field("main", "prep", ""),
            "deviceType": field("NVIDIA", "MLU", ""),
            "allowedDeviceUUIDs": allowed,
            "mode": field("best-effort", "strict", "none"),
            "timeoutMs": st.integers(1, 3000) | st.integers() | json_values,
            "extra": json_values,
        },
    )


own_token = st.just("node-1")
tokens = st.one_of(
    own_token,
    own_token,
    own_token,
    st.sampled_from(["node-2", "node_1", "Node-1"]),
    st.text(alphabet=string.ascii_letters + string.digits + "-_#$%ñ", min_size=1, max_size=300),
    st.integers(254, 4000).map(lambda n: "t" * n),
)


async def ledger_of(h: Harness) -> Any:
    snapshot = await h.client.snapshot("node-1")
    state = snapshot["nodes"][0]
    return state["revision"], [
        (p["pod"]["metadata"]["uid"], p["pod"]["metadata"]["annotations"]) for p in state["pods"]
    ]


async def test_malformed_refits_are_refused_and_change_nothing(
    nats_url: str, tmp_path: Path
) -> None:
    async with harness(nats_url, tmp_path, worked_objects()) as h:
        created = await h.pod("ml", "train")
        uid = created["metadata"]["uid"]
        ledger_before = await ledger_of(h)
        loop = asyncio.get_running_loop()
        seen: dict[str, int] = {}

        async def one(token: str, payload: bytes) -> None:
            reply = await raw_refit(h, token, payload, within=5)
            assert reply["succeeded"] is False, (token[:40], payload[:300], reply)
            assert reply["code"] in DESIGN_REFIT_FAILURES, reply
            assert isinstance(reply["failureReason"], str)
            assert len(reply["failureReason"]) <= 512
            seen[reply["code"]] = seen.get(reply["code"], 0) + 1

        def body(**changes: Any) -> bytes:
            base = {
                "podUID": uid,
                "podNamespace": "ml",
                "podName": "train",
                "nodeName": "node-1",
                "containerIndex": 1,
                "containerName": "main",
                "deviceType": "NVIDIA",
                "allowedDeviceUUIDs": ["GPU-x"],
            }
            base.update(changes)
            return encode(base)

        @example(token="node-1", payload=body())  # no_fit: no allowed GPU of the node
        @example(token="node-1", payload=body(podName="other"))  # pod_mismatch
        @example(token="node-1", payload=body(containerName="prep"))  # container_name_mismatch
        @example(token="node-1", payload=body(containerIndex=0, containerName="prep"))
        @example(token="node-1", payload=body(containerIndex=2))  # container_out_of_range
        @example(token="node-2", payload=body(nodeName="node-2"))  # node_mismatch
        @example(token="a" * 4040, payload=body(nodeName="a" * 4040))  # invalid_request
        @settings(
            max_examples=150,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(
            token=tokens,
            payload=st.one_of(
                mutated_refits(uid).map(encode),
                mutated_refits(uid).map(encode),
                mutated_refits(uid).map(encode),
                mutated_refits(uid).map(encode),
                refit_bodies(uid).map(encode),
                json_values.map(encode),
                st.binary(max_size=64),
            ),
        )
        def check(token: str, payload: bytes) -> None:
            asyncio.run_coroutine_threadsafe(one(token, payload), loop).result(timeout=10)

        await asyncio.to_thread(check)

        assert await ledger_of(h) == ledger_before
        after = await h.pod("ml", "train")
        assert after["metadata"]["annotations"] == created["metadata"]["annotations"]
        assert h.refit is not None and h.refit.readiness.failure is None
        print(f"\nfuzz replies by code: {dict(sorted(seen.items()))}")
        # The examples got past the pod lookup, into the checks that need the tracked pod.
        assert set(seen) >= PAST_THE_POD, seen
        await still_serving(h, created)
