"""Request derivation from Pod resources (reference d.1)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.config import CoreConfig, parse_config
from shared.core.errors import ConfigError, RequestError
from shared.core.keys import PERCENT_UNSET
from shared.core.model import ContainerKind
from shared.core.pods import ContainerSpec
from shared.core.requests import ContainerRequest, container_request


def spec(
    limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None
) -> ContainerSpec:
    return ContainerSpec("c", ContainerKind.APP, limits or {}, requests or {})


G, M, P, C = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)


@pytest.mark.parametrize(
    ("limits", "requests", "expected"),
    [
        ({}, {}, None),
        ({G: "0"}, {}, None),
        ({G: "1"}, {}, ContainerRequest(1, mem_percentage=100)),  # whole card by default
        ({G: 2, M: "3000", C: "30"}, {}, ContainerRequest(2, memreq=3000, coresreq=30)),
        ({G: "1", P: "50"}, {}, ContainerRequest(1, mem_percentage=50)),
        # the bounds themselves are valid
        ({G: "1", P: "1", C: "0"}, {}, ContainerRequest(1, mem_percentage=1)),
        ({G: "1", P: "100", C: "100"}, {}, ContainerRequest(1, mem_percentage=100, coresreq=100)),
        # a memory of 0 beside a percentage means "not given", as in HAMi: the percentage counts
        ({G: "1", M: "0", P: "25"}, {}, ContainerRequest(1, mem_percentage=25)),
        ({}, {G: "1", M: "100"}, ContainerRequest(1, memreq=100)),  # requests as fallback
        ({M: "200"}, {G: "1", M: "100"}, ContainerRequest(1, memreq=200)),  # limits win
        ({G: "1", M: "1k"}, {}, ContainerRequest(1, memreq=1000)),
    ],
)
def test_derivation(
    limits: dict[str, Any], requests: dict[str, Any], expected: ContainerRequest | None
) -> None:
    assert container_request(spec(limits, requests), CoreConfig()) == expected


@pytest.mark.parametrize(
    "limits",
    [
        {G: "1.5"},
        {G: "1", M: "1.5"},
        {G: "1", M: "-5"},
        {G: "1", M: "3Gi"},
        {G: "1", M: "lots"},
        {G: "1", C: "-1"},
        {G: True},
    ],
)
def test_invalid_values_refuse_rather_than_under_allocate(limits: dict[str, Any]) -> None:
    with pytest.raises(RequestError):
        container_request(spec(limits), CoreConfig())


@pytest.mark.parametrize(
    ("limits", "fragments"),
    [
        # HAMi clamps cores above 100 while fitting: numafit refuses instead of reserving less
        ({G: "1", C: "101"}, [C, "'101'", "0 to 100"]),
        ({G: "1", C: "150"}, [C, "'150'", "0 to 100"]),
        ({G: "1", C: "-1"}, [C, "'-1'", "0 to 100"]),
        # HAMi clamps a percentage above 100 and ignores one of 0 or less (the whole card)
        ({G: "1", P: "101"}, [P, "'101'", "1 to 100"]),
        ({G: "1", P: "0"}, [P, "'0'", "1 to 100"]),
        ({G: "1", P: "-5"}, [P, "'-5'", "1 to 100"]),
        # HAMi reads a memory of 0 as "not given" and reserves the whole card
        ({G: "1", M: "0"}, [M, "'0'", "at least 1"]),
        ({G: "-1"}, [G, "'-1'", "at least 0"]),
    ],
)
def test_out_of_range_values_are_refused_naming_resource_value_and_range(
    limits: dict[str, Any], fragments: list[str]
) -> None:
    with pytest.raises(RequestError) as refused:
        container_request(spec(limits), CoreConfig())
    for fragment in fragments:
        assert fragment in str(refused.value)
    assert "container 'c'" in str(refused.value)


def test_a_huge_quantity_is_refused_in_a_short_message() -> None:
    # Python's int() refuses a 5000-digit string with a bare ValueError (not a CoreError), and
    # echoing it would flood the webhook's denial.
    huge = "9" * 5000
    with pytest.raises(RequestError) as refused:
        container_request(spec({G: "1", M: huge}), CoreConfig())
    assert M in str(refused.value)
    assert len(str(refused.value)) < 300


def test_defaults_and_memory_factor() -> None:
    config = CoreConfig(default_memory=5000, default_cores=10, memory_factor=2)
    assert container_request(spec({G: "1"}), config) == ContainerRequest(
        1, memreq=5000, coresreq=10
    )
    assert container_request(spec({G: "1", M: "100"}), config) == ContainerRequest(
        1, memreq=200, coresreq=10
    )


def test_mem_on_uses_absolute_then_percentage() -> None:
    assert ContainerRequest(1, memreq=10).mem_on(40000) == 10
    assert ContainerRequest(1, mem_percentage=33).mem_on(40000) == 13200
    assert ContainerRequest(1, mem_percentage=PERCENT_UNSET).mem_on(40000) == 0


def test_config_parsing_refuses_unknown_keys_and_wrong_types() -> None:
    assert parse_config({"gpuSchedulerPolicy": "binpack"}).gpu_scheduler_policy == "binpack"
    with pytest.raises(ConfigError, match="unknown config key 'gpuPolicy'"):
        parse_config({"gpuPolicy": "binpack"})
    with pytest.raises(ConfigError, match="non-negative integer"):
        parse_config({"defaultMemory": "5"})
    with pytest.raises(ConfigError, match="memoryFactor"):
        parse_config({"memoryFactor": 0})
    # the pod's own cores are held to 0..100, and so is the default given in their absence
    with pytest.raises(ConfigError, match="defaultCores"):
        parse_config({"defaultCores": 101})
    assert parse_config({"defaultCores": 100}).default_cores == 100
