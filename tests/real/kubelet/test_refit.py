"""The NUMA refit on a real kubelet (v1.28.7, static CPU manager, Topology Manager
`single-numa-node` at container scope unless a case says `best-effort`) driving numafit's
device plugin. The `run` fixture puts kubelet on each case's policy.

The node (tests/real/kubelet/deviceplugin.py): GPU-0..3 on NUMA 0 with 81920 MiB, GPU-4..7 on
NUMA 1 with 40960 MiB; kubelet's only exclusive CPU is cpu1, on NUMA 1. A Guaranteed one-CPU
container is pinned to cpu1, so kubelet offers NUMA 1's GPUs only, while numafit's scheduler
(spread) reserves GPU-3 for a 20000 MiB share: every case below starts with that mismatch.

Each test checks what runs (the container's own output), kubelet's checkpoint, the pod's
annotations, accounting's ledger and per-GPU usage, and the events against each other.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import pytest

from tests.real.kubelet import cases
from tests.real.kubelet.deviceplugin import GPU_NUMA
from tests.real.kubelet.kubelet import SINGLE_NUMA_NODE
from tests.real.kubelet.observe import ALLOCATED, samples
from tests.real.kubelet.tier import kubelet_tier
from tests.real.waiting import poll

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.real.kubelet.cases import Case
    from tests.real.kubelet.node import RealNode
    from tests.real.kubelet.observe import ContainerSeen, PodSeen
    from tests.real.stack import NumafitStack

pytestmark = kubelet_tier()

IDLE = dict.fromkeys(GPU_NUMA, 0.0)


def usage(mib: dict[str, float]) -> dict[str, float]:
    """Accounting's expected MiB per GPU: `mib`'s, and zero on every other GPU."""
    return {**IDLE, **mib}


def refit_answers(stack: NumafitStack) -> dict[str, float]:
    """Best-effort refit requests the refit service has answered, by code."""
    found = samples(stack.metrics("refit"), "numafit_refit_requests_total")
    return {dict(k)["code"]: v for k, v in found.items() if dict(k)["mode"] == "best-effort"}


def agrees(container: ContainerSeen) -> None:
    """What runs, kubelet's checkpoint, the annotation and the ledger name the same GPUs."""
    replica_gpus = tuple(sorted({r.rsplit("-", 1)[0] for r in container.replicas}))
    assert container.gpus, f"{container.name} reported no GPU"
    assert replica_gpus == container.gpus, (container.replicas, container.gpus)
    assert container.allocated_gpus == container.gpus, (container.allocated, container.gpus)
    assert container.ledger == container.allocated, (container.ledger, container.allocated)


@pytest.mark.parametrize(
    "case",
    [cases.BEST_EFFORT_REFIT, cases.STRICT_REFIT, cases.BEST_EFFORT_POLICY_REFIT],
    ids=lambda c: c.name,
)
def test_refit_moves_the_reservation_to_kubelets_numa_node(
    run: Callable[[Case], PodSeen], case: Case
) -> None:
    seen = run(case)
    assert (seen.phase, seen.reason) == ("Running", ""), seen.message
    (main,) = seen.containers
    assert main.gpus == ("GPU-7",)
    assert main.cpus == "1"
    assert main.allocated == (("GPU-7", 20000, 30),)
    agrees(main)
    assert seen.events_named("NumaRefitSucceed") == [
        "NUMA refit moved container 0 from [GPU-3] to [GPU-7]"
    ]
    assert "AllocationDiffersFromReservation" not in seen.event_reasons()
    assert seen.refits == {f"{case.alignment}/moved": 1}
    assert seen.reserved_memory == usage({"GPU-7": 20000})


def test_strict_that_cannot_be_aligned_is_refused_with_the_reason(
    run: Callable[[Case], PodSeen],
) -> None:
    """50000 MiB fits no NUMA 1 GPU: the strict pod is refused by kubelet's admission, the
    refit's reason in its status, and accounting releases its reservation."""
    seen = run(cases.STRICT_UNALIGNABLE)
    assert (seen.phase, seen.reason) == ("Failed", "UnexpectedAdmissionError"), seen.message
    reason = "numa-alignment strict: no allowed device fits: 4/4 CardInsufficientMemory"
    assert seen.message.startswith("Pod was rejected: "), seen.message
    assert reason in seen.message, seen.message
    assert seen.events_named("NumaRefitFailed") == [
        "no allowed device fits: 4/4 CardInsufficientMemory"
    ]
    (main,) = seen.containers
    assert (main.gpus, main.cpus, main.replicas) == ((), None, ())
    assert seen.annotations["hami.io/bind-phase"] == "failed"
    assert seen.refits == {"strict/strict_failed": 1}
    assert seen.allocations == 0
    assert seen.reserved_memory == IDLE
    # kubelet's own record of a container refused at admission.
    (status,) = seen.container_statuses
    terminated = status["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("ContainerStatusUnknown", 137)


@pytest.mark.parametrize(
    ("case", "why"),
    [
        pytest.param(cases.BEST_EFFORT_NO_FIT, "4/4 CardInsufficientMemory", id="no-fit"),
        pytest.param(cases.PINNED_ELSEWHERE, "4/4 CardUuidMismatch", id="pinned-elsewhere"),
    ],
)
def test_best_effort_never_falls_back_onto_a_gpu_breaking_the_pods_constraints(
    run: Callable[[Case], PodSeen], case: Case, why: str
) -> None:
    """The refit finds no NUMA 1 GPU for the pod (too little memory; or its use-gpuuuid
    names GPU-3 only) and kubelet offers no other: best-effort gives up NUMA alignment, not
    the pod's own constraints, so the plugin refuses instead of letting kubelet pick (which
    over-committed a GPU, or ran the pod on one it excluded: issue 21 item 4)."""
    seen = run(case)
    assert (seen.phase, seen.reason) == ("Failed", "UnexpectedAdmissionError"), seen.message
    assert seen.message.startswith("Pod was rejected: "), seen.message
    refusal = f"numa-alignment best-effort: no GPU kubelet offers satisfies the pod: {why}"
    assert refusal in seen.message, seen.message
    assert seen.events_named("NumaRefitFailed") == [f"no allowed device fits: {why}"]
    (main,) = seen.containers
    assert (main.gpus, main.cpus, main.replicas) == ((), None, ())
    assert seen.refits == {"best-effort/fallback_refused": 1}
    assert seen.allocations == 0
    assert seen.reserved_memory == IDLE


def test_best_effort_refit_unanswered_runs_kubelets_pick_and_records_it(
    single_numa_node: RealNode, numafit: NumafitStack
) -> None:
    """The refit service cannot answer (paused): the best-effort pod runs where kubelet puts
    it, on NUMA 1, and accounting and the annotations follow what runs; the refit's late
    answer, once the service resumes, moves nothing (deadlines travel with requests)."""
    refit = numafit.children["refit"]
    case = cases.Case(
        "best-effort-refit-unanswered", SINGLE_NUMA_NODE, (cases.MAIN,), "best-effort"
    )
    answered = refit_answers(numafit)
    refit.signal(signal.SIGSTOP)
    try:
        seen = single_numa_node.run(case, keep=True)
    finally:
        refit.signal(signal.SIGCONT)
    try:
        (main,) = seen.containers
        assert (seen.phase, main.cpus) == ("Running", "1"), seen.message
        (gpu,) = main.gpus
        assert GPU_NUMA[gpu] == 1
        assert main.allocated == ((gpu, 20000, 30),)
        agrees(main)
        assert seen.refits == {"best-effort/timeout": 1}
        assert seen.events_named("AllocationDiffersFromReservation") == [
            f"container 0 runs on {gpu}, not the reserved GPU-3; accounting follows what runs"
        ]
        assert seen.reserved_memory == usage({gpu: 20000})

        # The resumed refit service handles the request kubelet gave up on: by then its
        # deadline has passed, or Allocate has consumed the entry; either way it is refused
        # and nothing moves.
        def new_answers() -> dict[str, float] | None:
            now = refit_answers(numafit)
            added = {c: n - answered.get(c, 0) for c, n in now.items() if n > answered.get(c, 0)}
            return added or None

        late = poll(new_answers, within=30, what="the resumed refit service answered")
        assert late in (
            {"deadline_exceeded": 1},
            {"nothing_pending": 1},
        )
        current = single_numa_node.api.pod(seen.namespace, case.name)
        assert current["metadata"]["annotations"][ALLOCATED] == f"{gpu},NVIDIA,20000,30:;"
        assert single_numa_node.reserved_memory() == seen.reserved_memory
    finally:
        single_numa_node.delete(case.namespace, case.name, seen.uid)


def test_pod_not_opted_in_runs_kubelets_pick_and_accounting_follows(
    run: Callable[[Case], PodSeen],
) -> None:
    seen = run(cases.NOT_OPTED_IN)
    (main,) = seen.containers
    assert (seen.phase, main.cpus) == ("Running", "1"), seen.message
    (gpu,) = main.gpus
    assert GPU_NUMA[gpu] == 1
    assert main.allocated == ((gpu, 20000, 30),)
    agrees(main)
    assert not [r for r in seen.event_reasons() if r.startswith("NumaRefit")]
    assert seen.events_named("AllocationDiffersFromReservation") == [
        f"container 0 runs on {gpu}, not the reserved GPU-3; accounting follows what runs"
    ]
    assert seen.refits == {"none/not_opted_in": 1}
    assert seen.reserved_memory == usage({gpu: 20000})


def test_two_gpus_not_opted_in_run_on_two_distinct_gpus(run: Callable[[Case], PodSeen]) -> None:
    """Reserved on GPU-3 and GPU-2, offered NUMA 1's 40 replicas: kubelet must be led to two
    replicas of distinct GPUs (issue 21 item 3), never two of one GPU, which consume refuses
    (`allocation names a GPU twice`), failing the pod."""
    seen = run(cases.TWO_GPUS_NOT_OPTED_IN)
    assert (seen.phase, seen.reason, seen.message) == ("Running", "", ""), seen.message
    (main,) = seen.containers
    assert len(main.gpus) == 2, main.gpus
    assert {GPU_NUMA[g] for g in main.gpus} == {1}
    assert main.cpus == "1"
    assert sorted(main.allocated) == [(g, 10000, 30) for g in main.gpus]
    agrees(main)
    assert seen.reserved_memory == usage(dict.fromkeys(main.gpus, 10000))


def test_burstable_pod_is_not_pinned_and_keeps_its_reservation(
    run: Callable[[Case], PodSeen],
) -> None:
    """No exclusive CPU: only the GPUs are restricted, and kubelet's Topology Manager picks
    NUMA 0 for them (the narrowest hint, lowest first), where the reservation already is."""
    seen = run(cases.BURSTABLE)
    (main,) = seen.containers
    assert (seen.phase, main.gpus, main.cpus) == ("Running", ("GPU-3",), "0-1"), seen.message
    assert main.allocated == (("GPU-3", 20000, 30),)
    agrees(main)
    assert seen.refits == {"best-effort/no_mismatch": 1}
    assert not [r for r in seen.event_reasons() if r.startswith(("NumaRefit", "Allocation"))]
    assert seen.reserved_memory == usage({"GPU-3": 20000})


def test_init_container_devices_are_reused_by_the_app_container(
    run: Callable[[Case], PodSeen],
) -> None:
    """The init container (a whole GPU) is reserved on GPU-7 and kubelet offers NUMA 1: no
    move. kubelet then gives the app container the init container's replica and exclusive
    CPU without asking the plugin (its reuse rule): the app runs on GPU-7, not on its
    reservation GPU-3. Accounting records what runs, phase-aware (the finished init
    container's share is released), and reports no difference: the reuse is kubelet's rule,
    not a drift (issue 21 item 3)."""
    seen = run(cases.INIT_CONTAINERS)
    assert seen.phase == "Running", (seen.reason, seen.message)
    prep, main = seen.containers
    assert (prep.gpus, prep.cpus) == (("GPU-7",), "1")
    assert (main.gpus, main.cpus) == (("GPU-7",), "1")
    assert main.replicas == prep.replicas  # the same replica: reused, not allocated again
    assert prep.allocated == (("GPU-7", 40960, 0),)
    assert main.allocated == (("GPU-7", 20000, 30),)
    for container in (prep, main):
        agrees(container)
    assert seen.refits == {"strict/no_mismatch": 1}  # one GetPreferredAllocation: the init's
    assert seen.ledger_released is True
    assert seen.reserved_memory == usage({"GPU-7": 20000})
    assert "AllocationDiffersFromReservation" not in seen.event_reasons(), seen.events
