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
        ({G: "1", P: "250"}, {}, ContainerRequest(1, mem_percentage=100)),  # clamped
        ({G: "1", P: "0"}, {}, ContainerRequest(1, mem_percentage=100)),  # ignored
        ({G: "1", C: "150"}, {}, ContainerRequest(1, mem_percentage=100, coresreq=150)),
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
