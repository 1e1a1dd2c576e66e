"""Phase-aware accounting (reference e.2-e.4, e.7) and its invariants."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.core.accounting import collapse, effective, steady_state, track_pod
from shared.core.model import ContainerDevice, ContainerKind, Usage
from shared.core.pods import pod_from_object
from tests.builders import container, pod

S, I, A = ContainerKind.SIDECAR, ContainerKind.INIT, ContainerKind.APP  # noqa: E741
GB = 1000


def row(uuid: str, mem: int, cores: int = 0) -> tuple[ContainerDevice, ...]:
    return (ContainerDevice(uuid, "NVIDIA", mem, cores),)


def test_init_then_app_on_one_gpu_counts_the_peak_not_the_sum() -> None:
    # e.7: regular init 30 GB + app 20 GB on GPU-b never run together.
    usage = collapse([I, A], [row("GPU-b", 30 * GB, 60), row("GPU-b", 20 * GB, 30)])
    assert usage == {"GPU-b": Usage(30 * GB, 60, 1)}


def test_sidecar_and_app_are_concurrent() -> None:
    usage = collapse([S, A], [row("GPU-b", 30 * GB), row("GPU-b", 20 * GB)])
    assert usage == {"GPU-b": Usage(50 * GB, 0, 2)}


def test_regular_init_is_charged_with_sidecars_declared_before_it_only() -> None:
    kinds = [S, I, S, A]
    rows = [row("G", 10), row("G", 25), row("G", 7), row("G", 1)]
    # init sees sidecar 10 -> 35; running = 10 + 7 + 1 = 18; peak wins
    assert collapse(kinds, rows) == {"G": Usage(35, 0, 3)}  # slots: 2 sidecars + app
    assert steady_state(kinds, rows) == {"G": Usage(18, 0, 3)}


def test_steady_state_drops_init_only_gpus_and_collapse_keeps_them() -> None:
    kinds = [I, A]
    rows = [row("GPU-a", 30), row("GPU-b", 20)]
    assert collapse(kinds, rows) == {"GPU-a": Usage(30, 0, 1), "GPU-b": Usage(20, 0, 1)}
    assert steady_state(kinds, rows) == {"GPU-b": Usage(20, 0, 1)}
    assert effective(kinds, rows, released=True) == steady_state(kinds, rows)
    assert effective(kinds, rows, released=False) == collapse(kinds, rows)


def test_usage_of_different_gpus_is_never_merged_and_output_is_sorted() -> None:
    usage = collapse([A, A], [row("GPU-z", 1), row("GPU-a", 2)])
    assert list(usage) == ["GPU-a", "GPU-z"]


def test_released_rule_needs_every_regular_init_exited_zero() -> None:
    def released(init: list[dict[str, object]], exits: dict[str, int] | None) -> bool:
        obj = pod("p", init=init, containers=[container("app")], init_exit=exits)
        return pod_from_object(obj).init_released()

    assert released([container("i")], {"i": 0})
    assert not released([container("i")], {"i": 1})  # a failed init holds the peak
    assert not released([container("i"), container("j")], {"i": 0})
    assert released([container("s", sidecar=True)], None)  # only sidecars: at once
    assert not released([], None)  # no init containers: never


def test_track_pod_stores_effective_usage_and_skips_untracked_or_terminal_pods() -> None:
    allocated = "GPU-b,NVIDIA,30000,60:;GPU-b,NVIDIA,20000,30:;"
    init, containers = [container("prep")], [container("main")]
    running = track_pod(
        pod_from_object(pod("p", allocated=allocated, init=init, containers=containers))
    )
    assert running is not None and running.usage == {"GPU-b": Usage(30000, 60, 1)}
    done = pod("p", allocated=allocated, init_exit={"prep": 0}, init=init, containers=containers)
    released = track_pod(pod_from_object(done))
    assert released is not None and released.usage == {"GPU-b": Usage(20000, 30, 1)}
    assert track_pod(pod_from_object(pod("q", init=init, containers=containers))) is None
    finished = pod("r", allocated=allocated, phase="Succeeded", init=init, containers=containers)
    assert track_pod(pod_from_object(finished)) is None


def test_undecodable_annotation_keeps_the_pod_tracked_with_an_error() -> None:
    tracked = track_pod(
        pod_from_object(pod("p", allocated="GPU-a,NVIDIA,x,1:;", containers=[container("c")]))
    )
    assert tracked is not None
    assert tracked.decode_error is not None and "cannot decode allocated" in tracked.decode_error
    assert tracked.usage == {}


_kind = st.sampled_from([S, I, A])
_row = st.lists(
    st.builds(
        ContainerDevice,
        uuid=st.sampled_from(["GPU-a", "GPU-b", "GPU-c"]),
        type=st.just("NVIDIA"),
        usedmem=st.integers(0, 80000),
        usedcores=st.integers(0, 100),
    ),
    max_size=2,
    unique_by=lambda d: d.uuid,
).map(tuple)
_pod = st.lists(st.tuples(_kind, _row), max_size=6).map(
    lambda items: (
        # HAMi's layout: every init container (sidecar or regular) precedes the apps.
        [k for k, _ in sorted(items, key=lambda i: i[0] is A)],
        [r for _, r in sorted(items, key=lambda i: i[0] is A)],
    )
)


def _phase_sum(
    kinds: list[ContainerKind], rows: list[tuple[ContainerDevice, ...]], members: list[int]
) -> dict[str, Usage]:
    result: dict[str, Usage] = {}
    for j in members:
        for d in rows[j]:
            result[d.uuid] = result.get(d.uuid, Usage()) + Usage(d.usedmem, d.usedcores, 1)
    return result


@given(_pod)
def test_collapse_is_at_least_the_steady_state_and_every_single_phase(
    layout: tuple[list[ContainerKind], list[tuple[ContainerDevice, ...]]],
) -> None:
    kinds, rows = layout
    collapsed = collapse(kinds, rows)
    phases = [steady_state(kinds, rows)]
    for i, kind in enumerate(kinds):
        if kind is I:  # a regular init runs beside the sidecars declared before it
            phases.append(_phase_sum(kinds, rows, [j for j in range(i) if kinds[j] is S] + [i]))
    for phase in phases:
        for uuid, value in phase.items():
            assert collapsed[uuid].mem >= value.mem
            assert collapsed[uuid].cores >= value.cores
            assert collapsed[uuid].slots >= value.slots
    # ... and it is exactly the largest of them, per component.
    for uuid, value in collapsed.items():
        assert value.mem == max(p.get(uuid, Usage()).mem for p in phases)
