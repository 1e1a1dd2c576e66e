"""The scheduler's NUMA bookkeeping (svc_scheduler/topology.py): the figures it predicts
from, the placements those figures lag behind, and how predictions are judged. Pure."""

from __future__ import annotations

from typing import Any

import orjson

from shared.core import codec, keys
from shared.core.config import CoreConfig
from shared.core.model import ContainerDevice, NodeSnapshot, snapshot_of
from shared.core.nrt import NodeTopology
from shared.core.numa_prediction import TopologyPolicy, TopologyScope
from shared.core.pods import pod_from_object
from shared.core.requests import pod_requests
from svc_scheduler.topology import ASSUMED_TTL, FOREIGN_LAG, TopologyState
from tests.builders import container, gpu, pod

NODE = "node-1"
T0 = 1_800_000_000.0


def figures(
    cpus: dict[int, int],
    sampled_at: float | None,
    policy: TopologyPolicy = TopologyPolicy.SINGLE_NUMA_NODE,
) -> NodeTopology:
    return NodeTopology(NODE, policy, TopologyScope.CONTAINER, cpus, sampled_at)


def snapshot() -> NodeSnapshot:
    devices = codec.parse_register(
        orjson.dumps([gpu(f"GPU-{i}", i // 2, index=i) for i in range(4)]).decode()
    )
    return snapshot_of(NODE, devices)


def gpu_pod(name: str, cpu: int, *, strict: bool = False, mem: int = 1000) -> dict[str, Any]:
    spec = container("main", 1, mem)
    # CPU and memory limits: a Guaranteed pod, whose whole CPUs kubelet pins.
    spec["resources"]["limits"].update({"cpu": str(cpu), "memory": "1Gi"})
    annotations = {keys.NUMA_ALIGNMENT: "strict"} if strict else {}
    return pod(name, containers=[spec], annotations=annotations)


def predict(state: TopologyState, obj: dict[str, Any]) -> Any:
    info = pod_from_object(obj)
    return info, state.predict({NODE: snapshot()}, info, pod_requests(info, CoreConfig()))


def place(state: TopologyState, obj: dict[str, Any], at: float, uuid: str = "GPU-0") -> Any:
    info, predictions = predict(state, obj)
    row = (ContainerDevice(uuid, "NVIDIA", 1000, 0),)
    counts = state.placed(info, NODE, [row], [0], predictions.get(NODE), at)
    return info, predictions, counts


def test_a_node_without_figures_predicts_nothing_and_counts_none() -> None:
    state = TopologyState()
    info, predictions, counts = place(state, gpu_pod("a", 4), T0)
    assert predictions == {}
    assert counts == {"none": 1}
    # A retried filter of the same pod does not count it again.
    assert state.placed(info, NODE, [()], [0], None, T0 + 1) == {}


def test_policy_none_predicts_nothing() -> None:
    state = TopologyState()
    state.apply(figures({0: 32, 1: 32}, T0, TopologyPolicy.NONE), T0)
    _, predictions = predict(state, gpu_pod("a", 4))
    assert predictions == {}


def test_kubelet_choice_follows_the_free_cpus() -> None:
    state = TopologyState()
    state.apply(figures({0: 32, 1: 32}, T0), T0)
    _, predictions = predict(state, gpu_pod("a", 8))
    assert predictions[NODE].plan.numa_of == {0: 0}
    state.apply(figures({0: 6, 1: 32}, T0 + 1), T0 + 1)  # NUMA 0's CPUs taken
    _, predictions = predict(state, gpu_pod("b", 8))
    assert predictions[NODE].plan.numa_of == {0: 1}


def test_pods_placed_since_the_figures_were_taken_are_counted_against_them() -> None:
    state = TopologyState()
    state.apply(figures({0: 32, 1: 32}, T0), T0)
    first, _, _ = place(state, gpu_pod("first", 24), T0 + 1)
    assert state.free_cpus(NODE) == {0: 8, 1: 32}
    # The figures still say 32 free on NUMA 0, but 24 of them are promised: 16 go to NUMA 1.
    _, predictions = predict(state, gpu_pod("second", 16))
    assert predictions[NODE].plan.numa_of == {0: 1}
    # A pod is never counted against itself (a filter retried for it).
    assert state.free_cpus(NODE, exclude=first.uid) == {0: 32, 1: 32}
    # Older figures (taken before the placement) arriving late still lag behind it.
    state.apply(figures({0: 32, 1: 32}, T0 + 0.5), T0 + 2)
    assert state.free_cpus(NODE) == {0: 8, 1: 32}
    # Figures taken after it include it: it is no longer counted twice.
    state.apply(figures({0: 8, 1: 32}, T0 + 3), T0 + 3)
    assert state.free_cpus(NODE) == {0: 8, 1: 32}
    assert state.assumed(NODE) == 0


def test_figures_without_a_sampling_time_count_from_when_they_were_seen() -> None:
    state = TopologyState()
    state.apply(figures({0: 32, 1: 32}, None), T0)
    place(state, gpu_pod("first", 24), T0 + 1)
    state.apply(figures({0: 32, 1: 32}, None), T0 + 1 + FOREIGN_LAG / 2)
    assert state.free_cpus(NODE) == {0: 8, 1: 32}  # seen too soon after: may not include it
    state.apply(figures({0: 8, 1: 32}, None), T0 + 1 + 2 * FOREIGN_LAG)
    assert state.assumed(NODE) == 0


def test_a_strict_pod_gets_a_plan_that_only_allows_kubelet_choice() -> None:
    state = TopologyState()
    state.apply(figures({0: 32, 1: 32}, T0), T0)
    _, predictions = predict(state, gpu_pod("s", 4, strict=True))
    assert predictions[NODE].plan.only is True
    _, predictions = predict(state, gpu_pod("b", 4))
    assert predictions[NODE].plan.only is False


def test_a_pod_no_numa_node_can_hold_is_refused() -> None:
    state = TopologyState()
    state.apply(figures({0: 16, 1: 16}, T0), T0)
    _, predictions = predict(state, gpu_pod("big", 24))
    refusal = predictions[NODE].plan.refusal
    assert refusal is not None and refusal.startswith("NumaZoneInsufficient: no NUMA node has 24")


def test_dropped_figures_mean_no_prediction() -> None:
    state = TopologyState()
    state.apply(figures({0: 32, 1: 32}, T0), T0)
    state.drop(NODE)
    _, predictions = predict(state, gpu_pod("a", 4))
    assert predictions == {} and state.free_cpus(NODE) is None


def test_a_relist_keeps_only_the_listed_nodes() -> None:
    state = TopologyState()
    state.apply(figures({0: 32}, T0), T0)
    other = NodeTopology("node-2", TopologyPolicy.RESTRICTED, TopologyScope.CONTAINER, {0: 4}, T0)
    state.replace_all([other], T0 + 1)
    assert state.nodes() == ["node-2"]


# --- judging predictions -------------------------------------------------------------------


def settled(obj: dict[str, Any], allocated: str, phase: str = keys.PHASE_SUCCESS) -> dict[str, Any]:
    done = dict(obj)
    done["metadata"] = {
        **obj["metadata"],
        "annotations": {keys.ALLOCATED: allocated, keys.BIND_PHASE: phase},
    }
    return done


def judged(
    state: TopologyState, obj: dict[str, Any], uuid_reserved: str, result: dict[str, Any]
) -> Any:
    state.apply(figures({0: 32, 1: 32}, T0), T0)
    place(state, obj, T0 + 1, uuid_reserved)
    assert state.due(NODE) == []  # the figures do not include the pod yet
    due = state.apply(figures({0: 28, 1: 32}, T0 + 2), T0 + 2)
    assert [p.name for p in due] == [obj["metadata"]["name"]]
    return state.resolve(due[0], result)


def test_a_container_that_runs_where_it_was_reserved_is_a_hit() -> None:
    state = TopologyState()
    obj = gpu_pod("a", 4)
    runs = codec.encode_pod([(ContainerDevice("GPU-0", "NVIDIA", 1000, 0),)])
    assert judged(state, obj, "GPU-0", settled(obj, runs)) == {"hit": 1}
    assert state.pending() == 0


def test_a_container_moved_by_a_refit_is_a_miss() -> None:
    state = TopologyState()
    obj = gpu_pod("a", 4)
    runs = codec.encode_pod([(ContainerDevice("GPU-1", "NVIDIA", 1000, 0),)])
    assert judged(state, obj, "GPU-0", settled(obj, runs)) == {"miss": 1}


def test_a_pod_that_failed_admission_is_a_miss() -> None:
    state = TopologyState()
    obj = gpu_pod("a", 4)
    runs = codec.encode_pod([(ContainerDevice("GPU-0", "NVIDIA", 1000, 0),)])
    assert judged(state, obj, "GPU-0", settled(obj, runs, keys.PHASE_FAILED)) == {"miss": 1}


def test_a_pod_still_allocating_is_judged_later_and_a_gone_one_never() -> None:
    state = TopologyState()
    obj = gpu_pod("a", 4)
    runs = codec.encode_pod([(ContainerDevice("GPU-0", "NVIDIA", 1000, 0),)])
    assert judged(state, obj, "GPU-0", settled(obj, runs, keys.PHASE_ALLOCATING)) is None
    assert state.pending() == 1
    (pending,) = state.due(NODE)
    assert state.resolve(pending, None) == {}
    assert state.pending() == 0


def test_a_pod_recreated_under_the_same_name_is_not_judged_by_the_new_one() -> None:
    state = TopologyState()
    obj = gpu_pod("a", 4)
    other = gpu_pod("a", 4)  # same name, another uid
    runs = codec.encode_pod([(ContainerDevice("GPU-0", "NVIDIA", 1000, 0),)])
    assert judged(state, obj, "GPU-0", settled(other, runs)) == {}


def test_placements_that_never_show_up_are_forgotten_after_the_ttl() -> None:
    state = TopologyState()
    state.apply(figures({0: 32, 1: 32}, T0), T0)
    place(state, gpu_pod("never-bound", 24), T0 + 1)
    # Figures that do not include it (taken before it), seen much later.
    late = T0 + 1 + ASSUMED_TTL + 1
    assert state.apply(figures({0: 32, 1: 32}, T0 + 0.5), late) == []
    assert state.assumed(NODE) == 0 and state.pending() == 0
    assert state.free_cpus(NODE) == {0: 32, 1: 32}
