"""Device scoring and the GPU ordering policies (reference d.3 and d.4).

Devices are sorted ascending by the policy's key and the fit walks the list from the last
element to the first, so "last" means "most preferred". Ties end on the device index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core.errors import AnnotationError, shown
from shared.core.keys import INT32_MAX, SCORE_WEIGHT_FACTOR, SCORING_WEIGHTS
from shared.core.model import DeviceUsage

if TYPE_CHECKING:
    from shared.core.requests import ContainerRequest


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    """`hami.io/device-scoring-weights`: slot, core and memory weights (default 1 each)."""

    slot: int = 1
    core: int = 1
    memory: int = 1


_WEIGHT_KEYS = ("slot", "core", "memory")


MAX_WEIGHT = INT32_MAX
"""A weight multiplies a ratio of at most a few units: larger ones only overflow (HAMi's are
Go ints), and Python's int() refuses over 4300 digits with a bare ValueError."""


def parse_scoring_weights(text: str | None) -> ScoringWeights:
    """Exactly three `key=value` items `slot`, `core`, `memory` in any order, no duplicates,
    integers 0 to MAX_WEIGHT, at least one positive. None means the default."""
    if text is None:
        return ScoringWeights()
    values: dict[str, int] = {}
    items = text.split(",")
    quoted = shown(text)
    if len(items) != 3:
        raise AnnotationError(
            f"{SCORING_WEIGHTS} {quoted}: need exactly three items slot=,core=,memory="
        )
    for item in items:
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or key not in _WEIGHT_KEYS:
            raise AnnotationError(f"{SCORING_WEIGHTS} {quoted}: bad item {shown(item.strip())}")
        if key in values:
            raise AnnotationError(f"{SCORING_WEIGHTS} {quoted}: {key!r} given twice")
        digits = value.lstrip("0") or "0"
        if (
            not value.isascii()
            or not value.isdigit()
            or len(digits) > len(str(MAX_WEIGHT))
            or int(digits) > MAX_WEIGHT
        ):
            raise AnnotationError(
                f"{SCORING_WEIGHTS} {quoted}: {key} must be an integer from 0 to {MAX_WEIGHT}"
            )
        values[key] = int(digits)
    if not any(values.values()):
        raise AnnotationError(f"{SCORING_WEIGHTS} {quoted}: at least one weight must be positive")
    return ScoringWeights(values["slot"], values["core"], values["memory"])


def device_score(device: DeviceUsage, request: ContainerRequest, weights: ScoringWeights) -> float:
    """HAMi's utilisation score of a device if `request` were added to it."""
    info = device.info
    if info.count == 0 or info.devcore == 0 or info.devmem == 0:
        return 0.0
    if not info.matches_vendor(request.type):
        return float(
            SCORE_WEIGHT_FACTOR
            * (
                weights.slot * device.used / info.count
                + weights.core * device.usedcores / info.devcore
                + weights.memory * device.usedmem / info.devmem
            )
        )
    return float(
        SCORE_WEIGHT_FACTOR
        * (
            weights.slot * (request.nums + device.used) / info.count
            + weights.core * (request.coresreq + device.usedcores) / info.devcore
            + weights.memory * (request.mem_on(info.devmem) + device.usedmem) / info.devmem
        )
    )


@dataclass(frozen=True, slots=True)
class Policy:
    """A parsed `hami.io/gpu-scheduler-policy` value."""

    raw: str
    chain: tuple[str, ...] | None
    """Sort keys of a chain policy (binpack, spread, numa), None for a single policy."""
    mutex: bool
    topology_aware: bool

    @property
    def single(self) -> str:
        return self.raw


_CHAIN_KEYS = ("binpack", "spread", "numa")
GPU_POLICY_WORDS = ("binpack", "spread", "numa", "mutex", "topology-aware")
"""What a GPU policy may be made of: one of these, or a comma chain of them."""


def check_gpu_policy(text: str) -> str | None:
    """Why `text` is not a GPU policy (None when it is): one of GPU_POLICY_WORDS, or a comma
    chain of them (`binpack,numa`), case and spaces ignored. The configured default and the
    pod annotation keep the same rule: HAMi sorts anything else as spread, which hides a
    typo (`binpak`) until the placements look wrong."""
    parts = [part.strip() for part in text.strip().lower().split(",")]
    unknown = [part for part in parts if part not in GPU_POLICY_WORDS]
    if not unknown:
        return None
    words = ", ".join(GPU_POLICY_WORDS)
    return (
        f"{shown(text)} is not a GPU policy: use one of {words}, or a comma chain of them "
        "such as binpack,numa"
    )


def parse_policy(text: str) -> Policy:
    raw = text.strip().lower()
    chain: tuple[str, ...] | None = None
    if "," in raw or raw == "numa":
        keys: list[str] = []
        for name in (part.strip() for part in raw.split(",")):
            if name in _CHAIN_KEYS and name not in keys:
                keys.append(name)
        chain = tuple(keys)
    return Policy(raw, chain, "mutex" in raw, "topology-aware" in raw)


SortKey = Callable[[DeviceUsage], tuple[float, ...]]


def order_devices(
    devices: Sequence[DeviceUsage],
    request: ContainerRequest,
    policy: Policy,
    numa_bind: bool,
    weights: ScoringWeights,
) -> list[DeviceUsage]:
    """Devices sorted ascending by the policy; the fit walks the result from the end."""
    scores = {id(d): device_score(d, request, weights) for d in devices}

    def score(d: DeviceUsage) -> float:
        return scores[id(d)]

    if policy.chain is not None:
        key = _chain_key(policy.chain, numa_bind, score)
    else:
        key = _single_key(policy.raw, numa_bind, score)
    return sorted(devices, key=key)


def _chain_key(
    chain: tuple[str, ...], numa_bind: bool, score: Callable[[DeviceUsage], float]
) -> SortKey:
    """A comma-separated policy: each named criterion in turn (numa first under numa-bind)."""
    keys = list(chain) or ["spread"]
    if numa_bind:
        keys = ["numa", *(k for k in keys if k != "numa")]
    parts: list[Callable[[DeviceUsage], float]] = []
    for name in keys:
        if name == "binpack":
            parts.append(score)
        elif name == "spread":
            parts.append(lambda d: -score(d))
        else:
            parts.append(lambda d: float(d.info.numa))

    def key(d: DeviceUsage) -> tuple[float, ...]:
        return (*(p(d) for p in parts), float(d.info.index))

    return key


def _single_key(raw: str, numa_bind: bool, score: Callable[[DeviceUsage], float]) -> SortKey:
    """A single policy value: binpack, mutex, or spread (the default, and any other value)."""
    if raw == "binpack" and numa_bind:
        return lambda d: (-float(d.info.numa), score(d), float(d.info.index))
    if raw == "binpack":
        return lambda d: (score(d), float(d.info.numa), float(d.info.index))
    if raw == "mutex" and not numa_bind:
        return lambda d: (-float(d.used), float(d.info.numa), float(d.info.index))
    if numa_bind:
        return lambda d: (float(d.info.numa), -score(d), float(d.info.index))
    return lambda d: (-score(d), float(d.info.numa), float(d.info.index))
