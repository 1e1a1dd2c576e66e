"""Hypothesis strategies for hostile input: subject tokens, and bodies for every operation.

Bodies come in three kinds: bytes that are not JSON at all, arbitrary JSON values, and the
operation's own shape with any field dropped, retyped or given a hostile value (that is where
type confusion hides). Pod identities are never those of the pods the fuzz system holds, so no
generated request can legitimately change anything.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from hypothesis import strategies as st

from shared.core import keys

SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
TEXT = st.characters(blacklist_categories=SURROGATES)
"""Any character a JSON string can carry (lone surrogates cannot be encoded)."""

SCALARS: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(TEXT, max_size=30),
)
JSON: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(TEXT, max_size=10), children, max_size=4),
    ),
    max_leaves=12,
)

LONG_LENGTHS = [64, 253, 254, 1024, 4000, 4040, 4070, 4100, 5000]


def long_strings(chars: str = "ac9-_.") -> st.SearchStrategy[str]:
    return st.builds(
        lambda c, n: c * n, st.sampled_from(list(chars)), st.sampled_from(LONG_LENGTHS)
    )


def hostile_text(*usual: str) -> st.SearchStrategy[Any]:
    """A field's usual values, other text, very long text, or any JSON value."""
    return st.one_of(
        st.sampled_from(list(usual) or [""]),
        st.text(TEXT, max_size=40),
        long_strings(),
        JSON,
    )


def hostile_int(low: int, high: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(min_value=low, max_value=high),
        st.sampled_from([-1, 0, 2**31, 2**63, 2**64, -(2**63) - 1]),
        st.floats(),
        JSON,
    )


# --- subject tokens ----------------------------------------------------------------------------

WHITESPACE_TOKENS = ["\x0b", "a\x0cb"]
"""Tokens the broker delivers but nats-py's parser splits on (bytes `\\s` is [ \\t\\n\\r\\f\\v]):
test_over_long_names.py has them; here they would silence a target at its first example."""

TOKEN_CHARS = st.characters(
    blacklist_categories=SURROGATES, blacklist_characters="\r\n\x00\x0b\x0c"
)
VALID_TOKENS = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)

TOKENS: st.SearchStrategy[str] = st.one_of(
    st.just("node-1"),  # the node that exists: requests reach furthest there
    st.just("node-1"),
    st.sampled_from(["node-2", "fz-9", "_all", "node_1"]),
    VALID_TOKENS,
    VALID_TOKENS,
    st.sampled_from(["", "*", ">", "a.b", "NODE-1", "-x", "$SYS", "é", "\x1c", "\x85"]),
    st.sampled_from(["node 1", "\t", "a\tb", "x "]),  # the client or the broker refuses these
    st.text(TOKEN_CHARS, min_size=1, max_size=30),
    long_strings("az9-_ü"),
)


def node_name_for(token: str) -> str:
    """The node name whose subject token is `token` (dots become underscores in tokens)."""
    return token.replace("_", ".") if token != "_all" else token


# --- bodies ------------------------------------------------------------------------------------


def encoded(value: Any) -> bytes:
    """JSON text of `value`, NaN and big integers included (orjson refuses both: good)."""
    return json.dumps(value, allow_nan=True).encode()


def shaped(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """The shape `fields`, each field present or not, plus a few unknown keys."""
    return st.builds(
        lambda known, extra: {**extra, **known},
        st.fixed_dictionaries({}, optional=fields),
        st.dictionaries(st.text(TEXT, max_size=10), JSON, max_size=2),
    )


def near(
    valid: dict[str, st.SearchStrategy[Any]], hostile: dict[str, st.SearchStrategy[Any]]
) -> st.SearchStrategy[dict[str, Any]]:
    """A valid body (every field of `valid`) with up to three mutations: a field dropped, a
    field (of `valid` or `hostile`) given a hostile value, or an unknown key added. Mostly
    valid bodies reach past the first check; that is where the deeper bugs hide."""
    fields = sorted(set(valid) | set(hostile))

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        body = {key: draw(strategy, key) for key, strategy in valid.items()}
        for _ in range(draw(st.integers(min_value=0, max_value=3), "mutations")):
            key = draw(st.sampled_from(fields), "field")
            action = draw(st.sampled_from(["drop", "hostile", "hostile", "unknown"]), "action")
            if action == "drop":
                body.pop(key, None)
            elif action == "hostile":
                body[key] = draw(hostile.get(key, JSON), f"{key} value")
            else:
                body[draw(st.text(TEXT, max_size=10), "unknown key")] = draw(JSON, "unknown value")
        return body

    return build()


def bodies(shape: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    """Not JSON, any JSON, or (most often) the operation's own shape, mutated."""
    return st.one_of(
        st.binary(max_size=200),
        JSON.map(encoded),
        shape.map(encoded),
        shape.map(encoded),
        shape.map(encoded),
    )


FUZZ_UID = "uid-fuzz-never-created"
UUIDS = st.lists(hostile_text("GPU-a", "GPU-b", "GPU-a-0", "GPU-x"), max_size=4)


def refit_shape(node: str) -> st.SearchStrategy[dict[str, Any]]:
    """A refit request for a pod that does not exist (or is not the one named)."""
    return near(
        {
            "podUID": st.sampled_from([FUZZ_UID, "uid-1"]),
            "podNamespace": st.sampled_from(["ml", "default"]),
            "podName": st.sampled_from(["refit-probe", "nobody"]),
            "nodeName": st.sampled_from([node, node, "node-1"]),
            "containerIndex": st.integers(min_value=0, max_value=2),
            "containerName": st.sampled_from(["main", "other"]),
            "deviceType": st.sampled_from(["NVIDIA", "MLU"]),
            "allowedDeviceUUIDs": st.lists(st.sampled_from(["GPU-a", "GPU-b"]), max_size=2),
            "mode": st.sampled_from(["best-effort", "strict"]),
            "timeoutMs": st.integers(min_value=1, max_value=3000),
        },
        {
            "podUID": hostile_text(FUZZ_UID),
            "podNamespace": hostile_text("ml", "default"),
            "podName": hostile_text("refit-probe", "nobody"),
            "nodeName": hostile_text(node, "node-1"),
            "containerIndex": hostile_int(-3, 5),
            "containerName": hostile_text("main"),
            "deviceType": hostile_text("NVIDIA", "MLU", "nvidia"),
            "allowedDeviceUUIDs": st.one_of(UUIDS, st.just(["GPU-b"] * 600), JSON),
            "mode": hostile_text("best-effort", "strict"),
            "timeoutMs": hostile_int(-10, 10**7),
        },
    )


ENTRY_VALUES = ["GPU-a,NVIDIA,1000,10:;", "GPU-b,NVIDIA,1000,10:;", ";", "x,y:;", ",,,:;"]
ENTRIES = hostile_text(*ENTRY_VALUES)
REGISTER_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "id": st.sampled_from(["GPU-new", "GPU-a"]),
    "index": st.integers(min_value=0, max_value=7),
    "count": st.integers(min_value=1, max_value=10),
    "devmem": st.integers(min_value=1, max_value=80000),
    "devcore": st.just(100),
    "type": st.just("NVIDIA A100"),
    "numa": st.integers(min_value=0, max_value=1),
    "mode": st.just("hami-core"),
    "health": st.booleans(),
}
REGISTER_ITEM = near(
    REGISTER_FIELDS,
    {
        "id": hostile_text("GPU-a", "GPU-new"),
        "index": hostile_int(-1, 8),
        "count": hostile_int(-1, 100),
        "devmem": hostile_int(-1, 10**6),
        "devcore": hostile_int(-1, 200),
        "type": hostile_text("NVIDIA A100"),
        "numa": hostile_int(-1, 4),
        "mode": hostile_text("hami-core", "mig"),
        "health": JSON,
    },
)

ACCOUNTING_HOSTILE: dict[str, st.SearchStrategy[Any]] = {
    "node": hostile_text("node-1"),
    "podUID": hostile_text(FUZZ_UID),
    "podNamespace": hostile_text("ml", "default"),
    "podName": hostile_text("refit-probe", "filter-probe", "nobody"),
    "revision": hostile_int(-1, 50),
    "containerIndex": hostile_int(-3, 5),
    "toAllocate": ENTRIES,
    "allocated": ENTRIES,
    "phase": hostile_text(keys.PHASE_ALLOCATING, keys.PHASE_SUCCESS, keys.PHASE_FAILED),
    "devices": st.one_of(
        st.lists(hostile_text("GPU-a", "GPU-a-0"), max_size=3),
        st.lists(REGISTER_ITEM, max_size=3),
        JSON,
    ),
    "after": hostile_text("", "node-0"),
    "limit": hostile_int(-5, 10**6),
    "namespace": hostile_text("ml"),
    "deadlineMs": hostile_int(-5, 10**7),
}


def accounting_shape(op: str, node: str) -> st.SearchStrategy[dict[str, Any]]:
    """The operation's own request (for a pod that is not tracked), mutated."""
    revision = st.integers(min_value=0, max_value=20)
    entry = st.sampled_from(ENTRY_VALUES[:2])
    pod_uid = st.just(FUZZ_UID)
    valid: dict[str, dict[str, st.SearchStrategy[Any]]] = {
        "reserve": {
            "podUID": pod_uid,
            "podNamespace": st.just("ml"),
            "podName": st.sampled_from(["refit-probe", "nobody"]),
            "revision": revision,
            "allocated": entry,
        },
        "bind-phase": {"podUID": pod_uid, "phase": st.sampled_from(["allocating", "failed"])},
        "move": {
            "podUID": pod_uid,
            "revision": revision,
            "containerIndex": st.just(0),
            "toAllocate": entry,
            "allocated": entry,
        },
        "consume": {
            "devices": st.lists(st.sampled_from(["GPU-a", "GPU-b"]), max_size=2),
            "containerIndex": st.just(0),
        },
        "pending": {},
        "snapshot": {"podUID": pod_uid, "namespace": st.just("ml")}
        if node != "_all"
        else {"after": st.sampled_from(["", "node-0"]), "limit": st.integers(1, 600)},
        "register": {"devices": st.lists(near(REGISTER_FIELDS, {}), max_size=2)},
    }
    fields = {**valid[op], "deadlineMs": st.integers(min_value=0, max_value=3000)}
    if node != "_all":
        fields["node"] = st.sampled_from([node, node, "node-1"])
    return near(fields, ACCOUNTING_HOSTILE)


# --- the scheduler's HTTP bodies ----------------------------------------------------------------

RESOURCE_NAMES = [
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "cpu",
    "memory",
]
QUANTITY = st.one_of(
    st.sampled_from(["1", "2", "0", "-1", "100", "1e3", "10Gi", "abc", "", "0.5", "9" * 30]),
    st.integers(min_value=-5, max_value=2**40),
    SCALARS,
)
RESOURCES = st.one_of(st.dictionaries(st.sampled_from(RESOURCE_NAMES), QUANTITY, max_size=4), JSON)
GPU_LIMITS = near(
    {
        "nvidia.com/gpu": st.sampled_from(["1", "2"]),
        "nvidia.com/gpumem": st.sampled_from(["1000", "30000", "90000"]),
        "nvidia.com/gpucores": st.sampled_from(["10", "100"]),
    },
    dict.fromkeys(RESOURCE_NAMES, QUANTITY),
)
CONTAINER = near(
    {
        "name": st.sampled_from(["main", "side"]),
        "image": st.just("x"),
        "resources": near({"limits": GPU_LIMITS}, {"limits": RESOURCES, "requests": RESOURCES}),
    },
    {
        "name": hostile_text("main"),
        "resources": JSON,
        "restartPolicy": hostile_text("Always", "Never"),
    },
)
ANNOTATION_KEYS = [
    keys.NUMA_ALIGNMENT,
    keys.SCORING_WEIGHTS,
    keys.GPU_POLICY,
    keys.NODE_POLICY,
    keys.USE_UUID,
    keys.NOUSE_UUID,
    keys.USE_TYPE,
    keys.NOUSE_TYPE,
    keys.NUMA_BIND,
    keys.VGPU_MODE,
    *keys.SCHEDULER_OWNED,
    "other/key",
]
ANNOTATIONS = st.dictionaries(
    st.sampled_from(ANNOTATION_KEYS),
    hostile_text("best-effort", "strict", "maybe", "binpack", "spread", "GPU-a", "{", "[]"),
    max_size=3,
)
FUZZ_POD_NAMES = st.one_of(
    st.sampled_from(["fz", "fz-1", "", "Not_A_Name"]),
    st.text(TEXT, max_size=20).map(lambda t: "fz-" + t),
    long_strings("f"),
    JSON,
)
POD = near(
    {
        "metadata": near(
            {
                "name": st.sampled_from(["fz-1", "fz-2"]),
                "namespace": st.sampled_from(["ml", "default"]),
                "uid": st.just(FUZZ_UID),
                "annotations": st.dictionaries(
                    st.sampled_from([keys.NUMA_ALIGNMENT, keys.GPU_POLICY]),
                    st.sampled_from(["best-effort", "strict", "binpack"]),
                    max_size=1,
                ),
            },
            {
                "name": FUZZ_POD_NAMES,
                "namespace": hostile_text("ml"),
                "uid": hostile_text(FUZZ_UID),
                "annotations": st.one_of(ANNOTATIONS, JSON),
            },
        ),
        "spec": near(
            {"containers": st.lists(CONTAINER, min_size=1, max_size=2)},
            {
                "containers": st.one_of(st.lists(CONTAINER, max_size=3), JSON),
                "initContainers": st.one_of(st.lists(CONTAINER, max_size=2), JSON),
                "nodeName": hostile_text("", "node-1"),
                "schedulerName": hostile_text("numafit-scheduler"),
            },
        ),
        "status": st.just({"phase": "Pending"}),
    },
    {"metadata": JSON, "spec": JSON, "status": JSON},
)
NODE_NAMES = st.one_of(
    st.lists(hostile_text("node-1", "node-2", "", "node 1", "\t"), max_size=4), JSON
)
EXTENDER_ARGS = st.one_of(
    near(
        {
            "Pod": POD,
            "NodeNames": st.lists(st.sampled_from(["node-1", "node-2"]), min_size=1, max_size=2),
        },
        {"Pod": JSON, "NodeNames": NODE_NAMES, "nodenames": NODE_NAMES},
    ),
    near(
        {"Pod": POD, "Nodes": st.just({"items": [{"metadata": {"name": "node-1"}}]})},
        {
            "Nodes": st.one_of(
                shaped({"items": st.lists(shaped({"metadata": shaped({"name": JSON})}))}),
                JSON,
            ),
        },
    ),
)
BINDING_ARGS = near(
    {
        "PodName": st.sampled_from(["fz-1", "bind-probe"]),
        "PodNamespace": st.just("ml"),
        "PodUID": st.just(FUZZ_UID),
        "Node": st.sampled_from(["node-1", "node-2"]),
    },
    {
        "PodName": FUZZ_POD_NAMES,
        "PodNamespace": hostile_text("ml", "default"),
        "PodUID": hostile_text(FUZZ_UID),
        "Node": hostile_text("node-1", "node-2", "", "\t", "node 1"),
    },
)
REVIEW_REQUEST = near(
    {
        "uid": st.just("review-1"),
        "kind": st.just({"group": "", "version": "v1", "kind": "Pod"}),
        "resource": st.just({"group": "", "version": "v1", "resource": "pods"}),
        "operation": st.sampled_from(["CREATE", "UPDATE"]),
        "namespace": st.sampled_from(["ml", "default"]),
        "object": POD,
    },
    {
        "uid": hostile_text("review-1"),
        "kind": JSON,
        "resource": JSON,
        "operation": hostile_text("CREATE", "DELETE", "CONNECT"),
        "namespace": hostile_text("ml"),
        "name": FUZZ_POD_NAMES,
        "object": JSON,
        "oldObject": st.one_of(POD, JSON),
        "dryRun": st.one_of(st.booleans(), JSON),
    },
)
ADMISSION_REVIEW = near(
    {
        "apiVersion": st.just("admission.k8s.io/v1"),
        "kind": st.just("AdmissionReview"),
        "request": REVIEW_REQUEST,
    },
    {
        "apiVersion": hostile_text("admission.k8s.io/v1beta1"),
        "kind": hostile_text("AdmissionReview"),
        "request": JSON,
    },
)
