"""The pod annotations numafit reads, each held to one rule (shared/core/inputs.py).

They are read through `fit_options`, as the extender's filter reads them, so what is refused here
is what the filter refuses; the webhook's refusals are in tests/scheduler/test_admission_rules.py.
"""

from __future__ import annotations

import pytest

from shared.core import inputs, keys
from shared.core.config import CoreConfig
from shared.core.errors import AnnotationError
from shared.core.fit import fit_options
from shared.core.policy import ScoringWeights, parse_policy

MIB = 1 << 20


@pytest.mark.parametrize(
    ("key", "value", "fragments"),
    [
        (keys.GPU_POLICY, "bogus", ["'bogus'", "binpack", "spread"]),
        (keys.GPU_POLICY, "binpack,bogus", ["'binpack,bogus'"]),
        (keys.GPU_POLICY, "", ["''"]),
        (keys.NODE_POLICY, "bogus", ["'bogus'", "binpack or spread"]),
        (keys.NODE_POLICY, " ", ["' '"]),
        (keys.NUMA_ALIGNMENT, "maybe", ["'maybe'", "best-effort"]),
        (keys.NUMA_BIND, "yes", ["'yes'", "true"]),
        (keys.NUMA_BIND, "", ["''"]),
        (keys.SCORING_WEIGHTS, "slot=1", ["'slot=1'"]),
        # Python's int() would refuse 5000 digits with a bare ValueError
        (keys.SCORING_WEIGHTS, f"slot={'9' * 5000},core=1,memory=1", ["slot", "2147483647"]),
        (keys.SCORING_WEIGHTS, "slot=2147483648,core=1,memory=1", ["slot", "2147483647"]),
    ],
)
def test_invalid_values_are_refused_naming_annotation_and_value(
    key: str, value: str, fragments: list[str]
) -> None:
    with pytest.raises(AnnotationError) as refused:
        fit_options({key: value}, CoreConfig())
    message = str(refused.value)
    assert key in message
    for fragment in fragments:
        assert fragment in message
    assert len(message) < 400


READ = [
    keys.GPU_POLICY,
    keys.NODE_POLICY,
    keys.NUMA_ALIGNMENT,
    keys.NUMA_BIND,
    keys.SCORING_WEIGHTS,
    keys.USE_UUID,
    keys.NOUSE_UUID,
    keys.USE_TYPE,
    keys.NOUSE_TYPE,
    keys.VGPU_MODE,
]


def test_the_rules_cover_every_user_annotation_numafit_reads() -> None:
    assert sorted(inputs.READ_ANNOTATIONS) == sorted(READ)


@pytest.mark.parametrize("key", READ)
def test_every_annotation_read_is_bounded_and_never_echoed_whole(key: str) -> None:
    with pytest.raises(AnnotationError) as refused:
        fit_options({key: "x" * MIB}, CoreConfig())
    message = str(refused.value)
    assert key in message
    assert "1048576 bytes" in message
    assert len(message) < 400


def test_long_lists_within_the_bound_are_read() -> None:
    # 512 UUIDs of NVIDIA's form (the refit's own limit on a list) fit well within the bound.
    uuids = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(512)]
    options = fit_options({keys.USE_UUID: ",".join(uuids)}, CoreConfig())
    assert options.use_uuids == frozenset(uuids)


@pytest.mark.parametrize(
    ("annotations", "policy"),
    [
        ({keys.GPU_POLICY: " BinPack "}, "binpack"),
        ({keys.GPU_POLICY: "binpack,numa"}, "binpack,numa"),
        ({keys.GPU_POLICY: "mutex"}, "mutex"),
        ({keys.GPU_POLICY: "topology-aware"}, "topology-aware"),
        ({keys.NODE_POLICY: " Spread "}, "spread"),
        ({keys.NUMA_ALIGNMENT: " STRICT "}, "spread"),
        ({keys.NUMA_BIND: "True"}, "spread"),
        ({keys.NUMA_BIND: " 0 "}, "spread"),
        ({keys.USE_UUID: ""}, "spread"),  # an empty list means no constraint
        ({keys.SCORING_WEIGHTS: "slot=2147483647,core=0,memory=0"}, "spread"),
    ],
)
def test_valid_values_are_read(annotations: dict[str, str], policy: str) -> None:
    assert fit_options(annotations, CoreConfig()).policy == parse_policy(policy)


def test_values_read_as_documented() -> None:
    options = fit_options(
        {keys.NUMA_BIND: "t", keys.SCORING_WEIGHTS: "slot=2147483647,core=0,memory=0"},
        CoreConfig(),
    )
    assert options.numa_bind is True
    assert options.weights == ScoringWeights(2147483647, 0, 0)
    assert fit_options({keys.NUMA_BIND: "F"}, CoreConfig()).numa_bind is False
