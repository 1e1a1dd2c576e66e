"""The NUMA prediction rule (kubelet's choice per container), its use by the fit, and the
NodeResourceTopology reader: pure, table-driven, no event loop."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from shared.core.errors import ObjectError
from shared.core.fit import FitOptions, fit_pod
from shared.core.model import ContainerKind, DeviceInfo, DeviceUsage, NodeSnapshot
from shared.core.nodes import fit_node
from shared.core.nrt import ZoneResource, nrt_object, parse_nrt
from shared.core.numa_prediction import (
    NUMA_ZONE_INSUFFICIENT,
    ContainerDemand,
    KubeletChoice,
    NodeNuma,
    NumaPlan,
    TopologyPolicy,
    TopologyScope,
    Verdict,
    exclusive_cpus,
    free_replicas,
    kubelet_choice,
    plan_for,
    predict_pod,
)
from shared.core.policy import parse_policy
from shared.core.requests import ContainerRequest

SNN, RESTRICTED, BEST, NONE = (
    TopologyPolicy.SINGLE_NUMA_NODE,
    TopologyPolicy.RESTRICTED,
    TopologyPolicy.BEST_EFFORT,
    TopologyPolicy.NONE,
)
APP, INIT = ContainerKind.APP, ContainerKind.INIT


def choose(
    policy: TopologyPolicy,
    cpus: dict[int, int],
    replicas: dict[int, int],
    gpu: int = 1,
    cpu: int = 4,
    aware: bool = True,
) -> KubeletChoice:
    return kubelet_choice(
        policy,
        free_cpus=cpus,
        free_replicas=replicas,
        topology_aware=aware,
        gpu_count=gpu,
        cpu_count=cpu,
    )


# --- kubelet's choice for one container ---------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "cpus", "replicas", "gpu", "cpu", "expected"),
    [
        # The lowest NUMA node holding both the CPUs and a replica wins.
        (SNN, {0: 32, 1: 32}, {0: 40, 1: 40}, 1, 8, KubeletChoice(Verdict.ALIGNED, 0)),
        # NUMA 0 lacks the CPUs: NUMA 1.
        (SNN, {0: 6, 1: 32}, {0: 40, 1: 40}, 1, 8, KubeletChoice(Verdict.ALIGNED, 1)),
        # NUMA 0 has the CPUs but no free replica: NUMA 1.
        (SNN, {0: 32, 1: 32}, {0: 0, 1: 40}, 1, 8, KubeletChoice(Verdict.ALIGNED, 1)),
        # No exclusive CPUs: every NUMA node may hold them; the replicas decide.
        (SNN, {0: 0, 1: 0}, {0: 1, 1: 4}, 2, 0, KubeletChoice(Verdict.ALIGNED, 1)),
        # Nothing fits on one NUMA node: the aligning policies refuse.
        (
            SNN,
            {0: 8, 1: 2},
            {0: 0, 1: 10},
            1,
            4,
            KubeletChoice(Verdict.TOPOLOGY_AFFINITY_ERROR, None),
        ),
        (
            RESTRICTED,
            {0: 8, 1: 2},
            {0: 0, 1: 10},
            1,
            4,
            KubeletChoice(Verdict.TOPOLOGY_AFFINITY_ERROR, None),
        ),
        (
            SNN,
            {0: 2, 1: 2},
            {0: 10, 1: 10},
            1,
            4,
            KubeletChoice(Verdict.TOPOLOGY_AFFINITY_ERROR, None),
        ),
        # best-effort admits anyway: the CPU node with the most free replicas.
        (BEST, {0: 8, 1: 8}, {0: 2, 1: 3}, 5, 2, KubeletChoice(Verdict.UNALIGNED, 1)),
        (BEST, {0: 8, 1: 8}, {0: 3, 1: 3}, 5, 2, KubeletChoice(Verdict.UNALIGNED, 0)),
        (BEST, {0: 2, 1: 8}, {0: 9, 1: 9}, 1, 4, KubeletChoice(Verdict.ALIGNED, 1)),
        (BEST, {0: 2, 1: 2}, {0: 9, 1: 9}, 1, 4, KubeletChoice(Verdict.NOT_ENOUGH_CPUS, None)),
        # none: no device constraint; the CPUs go to the lowest node that holds them.
        (NONE, {0: 2, 1: 8}, {0: 9, 1: 0}, 2, 4, KubeletChoice(Verdict.UNCONSTRAINED, 1)),
        # No GPU: unconstrained.
        (SNN, {0: 32, 1: 32}, {0: 0, 1: 0}, 0, 4, KubeletChoice(Verdict.UNCONSTRAINED, 0)),
    ],
)
def test_kubelet_choice(
    policy: TopologyPolicy,
    cpus: dict[int, int],
    replicas: dict[int, int],
    gpu: int,
    cpu: int,
    expected: KubeletChoice,
) -> None:
    assert choose(policy, cpus, replicas, gpu, cpu) == expected


def test_gpus_without_numa_nodes_impose_no_constraint() -> None:
    assert choose(SNN, {0: 2, 1: 8}, {}, gpu=1, cpu=4, aware=False) == KubeletChoice(
        Verdict.UNCONSTRAINED, 1
    )


def test_numa_nodes_known_only_from_devices_count() -> None:
    # No exclusive CPUs configured at all: the NUMA nodes are those the free replicas report.
    assert choose(SNN, {}, {1: 3, -1: 5}, gpu=1, cpu=0) == KubeletChoice(Verdict.ALIGNED, 1)


@pytest.mark.parametrize(
    ("limits", "requests", "expected"),
    [
        ({"cpu": "4"}, {}, 4),
        ({"cpu": 4}, {"cpu": "4"}, 4),
        ({"cpu": "4"}, {"cpu": "2"}, 0),  # burstable: shared pool
        ({"cpu": "1500m"}, {}, 0),  # not whole
        ({"cpu": "2000m"}, {}, 2),
        ({}, {"cpu": "4"}, 0),  # no limit
        ({"cpu": "0"}, {}, 0),
        ({"cpu": "four"}, {}, 0),
    ],
)
def test_exclusive_cpus(limits: dict[str, Any], requests: dict[str, Any], expected: int) -> None:
    assert exclusive_cpus(limits, requests) == expected


# --- a whole pod --------------------------------------------------------------------------


def numa_node(
    cpus: dict[int, int],
    replicas: dict[int, int] | None = None,
    policy: TopologyPolicy = SNN,
    scope: TopologyScope = TopologyScope.CONTAINER,
) -> NodeNuma:
    return NodeNuma(policy, scope, cpus, replicas or {0: 40, 1: 40}, topology_aware=True)


def test_each_container_takes_its_cpus_before_the_next_is_decided() -> None:
    demands = [
        ContainerDemand("cpu-hog", APP, 20, 0),
        ContainerDemand("sidecar-free", APP, 0, 0),
        ContainerDemand("main", APP, 8, 1),
    ]
    prediction = predict_pod(numa_node({0: 24, 1: 32}), demands)
    assert prediction.predicted(1) is None  # no GPU
    assert prediction.predicted(2) == 1  # NUMA 0 has 4 CPUs left after cpu-hog's 20
    assert prediction.cpus == ((0, 20), (1, 8))
    assert prediction.refused is None


def test_an_app_container_reuses_its_init_containers_cpus_and_replicas() -> None:
    # kubelet's static policy and device manager: what a regular init container held is taken
    # first by the containers after it, and their hint must include its NUMA node. main
    # therefore lands on NUMA 0 (prepare's) with 8 of prepare's 20 CPUs and its replica, even
    # though NUMA 0 has only 4 CPUs free besides them; nothing more is taken there.
    demands = [
        ContainerDemand("prepare", INIT, 20, 1),
        ContainerDemand("main", APP, 8, 1),
    ]
    prediction = predict_pod(numa_node({0: 24, 1: 32}, {0: 1, 1: 40}), demands)
    assert (prediction.predicted(0), prediction.predicted(1)) == (0, 0)
    assert prediction.cpus == ((0, 20),)
    # A sidecar (restartable init container) adds nothing to reuse: the app after it needs
    # CPUs of its own, and NUMA 0's 4 free ones are too few.
    sidecar = [
        ContainerDemand("proxy", ContainerKind.SIDECAR, 20, 1),
        ContainerDemand("main", APP, 8, 1),
    ]
    prediction = predict_pod(numa_node({0: 24, 1: 32}, {0: 1, 1: 40}), sidecar)
    assert (prediction.predicted(0), prediction.predicted(1)) == (0, 1)
    assert prediction.cpus == ((0, 20), (1, 8))


def test_a_cpu_only_container_also_takes_cpus() -> None:
    demands = [ContainerDemand("cpu-only", APP, 30, 0), ContainerDemand("gpu", APP, 4, 1)]
    prediction = predict_pod(numa_node({0: 32, 1: 32}), demands)
    assert prediction.predicted(1) == 1
    assert prediction.cpus == ((0, 30), (1, 4))


def test_replicas_are_taken_too() -> None:
    demands = [ContainerDemand("a", APP, 1, 2), ContainerDemand("b", APP, 1, 1)]
    prediction = predict_pod(numa_node({0: 32, 1: 32}, {0: 2, 1: 5}), demands)
    assert (prediction.predicted(0), prediction.predicted(1)) == (0, 1)


def test_pod_scope_puts_the_pod_on_one_numa_node_sized_by_its_largest_phase() -> None:
    demands = [
        ContainerDemand("init", INIT, 10, 1),
        ContainerDemand("a", APP, 6, 1),
        ContainerDemand("b", APP, 6, 1),
    ]
    # The apps together need 12 CPUs: NUMA 0's 10 hold the init container but not them.
    node = numa_node({0: 10, 1: 16}, scope=TopologyScope.POD)
    prediction = predict_pod(node, demands)
    assert [prediction.predicted(p) for p in range(3)] == [1, 1, 1]
    assert prediction.cpus == ((1, 12),)


def test_a_pod_no_numa_node_can_hold_is_refused_under_an_aligning_policy() -> None:
    demands = [ContainerDemand("a", APP, 8, 1), ContainerDemand("big", APP, 40, 1)]
    node = numa_node({0: 32, 1: 32})
    prediction = predict_pod(node, demands)
    assert prediction.refused == demands[1]
    plan = plan_for(node, demands, prediction, strict=False)
    assert plan.refusal is not None and plan.refusal.startswith(NUMA_ZONE_INSUFFICIENT)
    assert "container big" in plan.refusal and "40 free CPUs" in plan.refusal


def test_under_best_effort_a_refused_pod_is_left_to_kubelet() -> None:
    demands = [ContainerDemand("big", APP, 40, 1)]
    node = numa_node({0: 32, 1: 32}, policy=BEST)
    plan = plan_for(node, demands, predict_pod(node, demands), strict=True)
    assert plan == NumaPlan(names=((0, "big"),))


def test_strict_pods_may_only_go_where_kubelet_choice_holds_their_gpus() -> None:
    demands = [ContainerDemand("a", APP, 8, 1)]
    node = numa_node({0: 32, 1: 32})
    prediction = predict_pod(node, demands)
    assert plan_for(node, demands, prediction, strict=True).only is True
    assert plan_for(node, demands, prediction, strict=False).only is False
    loose = numa_node({0: 32, 1: 32}, policy=BEST)
    assert plan_for(loose, demands, predict_pod(loose, demands), strict=True).only is False


def test_free_replicas_count_healthy_nvidia_slots_per_numa_node() -> None:
    snapshot = NodeSnapshot(
        "n",
        [
            device("GPU-0", 0, used=3),
            device("GPU-1", 0, used=12),  # over-subscribed: none free, never negative
            device("GPU-2", 1, health=False),
            device("GPU-3", 1),
            device("MLU-0", 1, type="MLU370"),
        ],
    )
    assert free_replicas(snapshot) == {0: 7, 1: 10}


# --- the fit, on the predicted NUMA node first --------------------------------------------


def device(uuid: str, numa: int, *, used: int = 0, usedmem: int = 0, **info: Any) -> DeviceUsage:
    fields: dict[str, Any] = {
        "count": 10,
        "devmem": 40000,
        "devcore": 100,
        "type": "NVIDIA A100",
        "index": int(uuid.rsplit("-", 1)[-1]),
        **info,
    }
    return DeviceUsage(DeviceInfo(uuid, numa=numa, **fields), used, usedmem)


def four_gpus(usedmem: int = 0) -> NodeSnapshot:
    return NodeSnapshot(
        "n",
        [
            device("GPU-0", 0, usedmem=usedmem),
            device("GPU-1", 0, usedmem=usedmem),
            device("GPU-2", 1),
            device("GPU-3", 1),
        ],
    )


SPREAD = FitOptions(parse_policy("spread"))


def test_without_a_prediction_spread_picks_the_emptiest_gpu() -> None:
    fit = fit_pod(four_gpus(usedmem=1000), [ContainerRequest(1, memreq=1000)], [APP], SPREAD)
    assert fit.ok and fit.rows[0][0].uuid in {"GPU-2", "GPU-3"}


def test_the_predicted_numa_node_is_tried_first() -> None:
    fit = fit_pod(
        four_gpus(usedmem=1000),
        [ContainerRequest(1, memreq=1000)],
        [APP],
        SPREAD,
        numa_first={0: 0},
    )
    assert fit.ok and fit.rows[0][0].uuid in {"GPU-0", "GPU-1"}


def test_a_full_predicted_numa_node_falls_back_unless_only() -> None:
    request = [ContainerRequest(1, memreq=30000)]
    fit = fit_pod(four_gpus(usedmem=20000), request, [APP], SPREAD, numa_first={0: 0})
    assert fit.ok and fit.rows[0][0].uuid in {"GPU-2", "GPU-3"}
    strict = fit_pod(
        four_gpus(usedmem=20000), request, [APP], SPREAD, numa_first={0: 0}, numa_only=True
    )
    assert not strict.ok and strict.failure is not None
    assert strict.failure.reason_text == "2/2 CardInsufficientMemory"


def test_fit_node_names_the_numa_zone_for_a_strict_pod() -> None:
    plan = NumaPlan(first=((0, 0),), only=True, names=((0, "infer"),))
    outcome = fit_node(
        four_gpus(usedmem=20000), [ContainerRequest(1, memreq=30000)], [APP], SPREAD, numa=plan
    )
    assert outcome.reason == (
        "NumaZoneInsufficient: kubelet would pin container infer to NUMA 0, whose GPUs cannot "
        "hold it: 2/2 CardInsufficientMemory"
    )


def test_fit_node_refuses_a_pod_kubelet_would_refuse() -> None:
    plan = NumaPlan(refusal="NumaZoneInsufficient: no NUMA node has 40 free CPUs")
    outcome = fit_node(four_gpus(), [ContainerRequest(1)], [APP], SPREAD, numa=plan)
    assert outcome.reason == "NumaZoneInsufficient: no NUMA node has 40 free CPUs"


# --- NodeResourceTopology -----------------------------------------------------------------

SAMPLED = datetime.datetime(2026, 11, 30, 12, 0, 0, 250000, tzinfo=datetime.UTC).timestamp()


def nrt(**changes: Any) -> dict[str, Any]:
    obj = nrt_object(
        "node-1",
        SNN,
        TopologyScope.CONTAINER,
        {
            0: [ZoneResource("cpu", 32, 30, 24), ZoneResource("nvidia.com/gpu", 40, 40, 38)],
            1: [ZoneResource("cpu", 32, 30, 30)],
        },
        SAMPLED,
    )
    obj.update(changes)
    return obj


def test_the_published_object_reads_back() -> None:
    topology = parse_nrt(nrt())
    assert topology.node == "node-1"
    assert (topology.policy, topology.scope) == (SNN, TopologyScope.CONTAINER)
    assert topology.free_cpus == {0: 24, 1: 30}
    assert topology.sampled_at == SAMPLED
    obj = nrt()
    assert obj["metadata"]["annotations"]["numafit.io/sampled-at"] == (
        "2026-11-30T12:00:00.250000+00:00"
    )
    assert obj["zones"][0]["resources"][0] == {
        "name": "cpu",
        "capacity": "32",
        "allocatable": "30",
        "available": "24",
    }


def test_an_exporter_object_as_nfd_writes_it() -> None:
    obj = {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": "worker-3", "resourceVersion": "812"},
        "topologyPolicies": ["RestrictedPodLevel"],
        "zones": [
            {
                "name": "node-1",
                "type": "Node",
                "resources": [{"name": "cpu", "available": "7500m"}],
            },
            {"name": "socket-0", "type": "Socket"},
            {"name": "node-0", "type": "Node", "resources": []},
        ],
    }
    topology = parse_nrt(obj)
    assert (topology.policy, topology.scope) == (RESTRICTED, TopologyScope.POD)
    assert topology.free_cpus == {0: 0, 1: 7}
    assert topology.sampled_at is None and topology.resource_version == "812"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attributes": None}, "no topologyManagerPolicy"),
        ({"attributes": [{"name": "topologyManagerPolicy", "value": "always"}]}, "unknown"),
        ({"attributes": "x" * 5000}, "must be a list"),
        ({"zones": {"node-0": {}}}, "zones must be a list"),
        ({"zones": [{"name": "numa0", "type": "Node"}]}, "is not node-<id>"),
        ({"zones": [{"name": "node-0", "type": "Node"}] * 2}, "given twice"),
        (
            {
                "zones": [
                    {
                        "name": "node-0",
                        "type": "Node",
                        "resources": [{"name": "cpu", "available": "lots"}],
                    }
                ]
            },
            "cpu available",
        ),
        ({"metadata": {}}, "no metadata.name"),
        ({"zones": [{"name": "node-0", "type": "Node"}] * 65}, "zones must be a list"),
    ],
)
def test_malformed_objects_are_refused_with_a_bounded_message(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ObjectError, match=message) as caught:
        parse_nrt(nrt(**change))
    assert len(str(caught.value)) < 300


def test_a_sampled_at_that_does_not_parse_is_ignored() -> None:
    obj = nrt()
    obj["metadata"]["annotations"]["numafit.io/sampled-at"] = "yesterday"
    assert parse_nrt(obj).sampled_at is None
