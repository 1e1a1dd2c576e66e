"""Every pod-level value numafit reads, and the rule it must keep: one place for all of them.

The admission webhook (`webhook_rules.review_pod_creation`) and the extender's filter read a pod
through the same two derivations, `requests.pod_requests` (its GPU resources) and
`fit.fit_options` (its annotations), and both hold each value to the rule written here. So a
value the webhook refuses is refused by the filter in the same words: a pod created while the
webhook was down or bypassed still gets its reason, as the filter's Error, which
kube-scheduler writes into the pod's FailedScheduling event (`kubectl describe pod`).

Where HAMi clamps or silently ignores a value, numafit refuses it: the pod would get something
other than what it asks for (less compute, or the whole card instead of none of its memory),
and only a refusal tells the operator why.

Resources, per container; limits first, requests as the fallback; whole numbers in any
quantity notation (`1`, `1k`, `1e3`), at most 64 characters:

- `nvidia.com/gpu`: 0 to 2^31-1; 0 asks for no GPU. Negative: refused (the API server refuses
  it too, after the mutating webhooks).
- `nvidia.com/gpumem` (MiB, times `memoryFactor`): 1 to 2^31-1; 0 only beside a percentage,
  which then sizes the request (HAMi reads 0 as "not given"). 0 alone: refused; HAMi reserves
  the whole card (or `defaultMemory`).
- `nvidia.com/gpumem-percentage`: 1 to 100. HAMi clamps a larger value to 100 and ignores one of
  0 or less (so the whole card is reserved): refused.
- `nvidia.com/gpucores`: 0 to 100 (percent of one GPU). HAMi clamps a larger value to 100 while
  fitting: refused.

Annotations, read only for pods that ask for a GPU; each is at most MAX_ANNOTATION_BYTES
(UTF-8), and a refusal never quotes more than `errors.SHOWN_CHARS` characters of it:

- `hami.io/gpu-scheduler-policy`: `binpack`, `spread`, `numa`, `mutex`, `topology-aware` or a
  comma chain of them, any case, spaces ignored (`policy.check_gpu_policy`, which the
  configured default keeps too). HAMi sorts an unknown value as `spread`: refused, as is an
  empty value.
- `hami.io/node-scheduler-policy`: `binpack` or `spread`, any case (`config.check_node_policy`).
  HAMi treats anything but `spread` as `binpack`: refused, as is an empty value.
- `hami.io/numa-alignment`: `best-effort` or `strict` (`pods.parse_alignment`), as HAMi's
  webhook.
- `hami.io/device-scoring-weights`: `policy.parse_scoring_weights`, each weight at most 2^31-1.
- `nvidia.com/numa-bind`: a Go boolean (`1 t T TRUE true True 0 f F FALSE false False`),
  surrounding spaces ignored. HAMi reads anything else as false: refused, as is an empty value.
- `nvidia.com/use-gpuuuid`, `nouse-gpuuuid`, `use-gputype`, `nouse-gputype`, `vgpu-mode`:
  free lists, as in HAMi (an empty one means no constraint); only their size is bounded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core import keys
from shared.core.codec import parse_go_bool
from shared.core.config import check_node_policy
from shared.core.errors import AnnotationError, PodAnnotationError, RequestError, shown
from shared.core.pods import parse_alignment
from shared.core.policy import check_gpu_policy, parse_scoring_weights

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

MAX_CORES = 100
"""`nvidia.com/gpucores` is a percent of one GPU's compute."""
MIN_PERCENTAGE, MAX_PERCENTAGE = 1, 100
"""`nvidia.com/gpumem-percentage`: some of the card, at most all of it."""
MAX_ANNOTATION_BYTES = 32 * 1024
"""Bytes of one annotation numafit reads: 512 UUIDs (the refit's own limit on a list) take
about 21 KiB; the API server allows 256 KiB for all of a pod's annotations together."""

READ_ANNOTATIONS = (
    keys.GPU_POLICY,
    keys.NODE_POLICY,
    keys.NUMA_ALIGNMENT,
    keys.SCORING_WEIGHTS,
    keys.NUMA_BIND,
    keys.USE_UUID,
    keys.NOUSE_UUID,
    keys.USE_TYPE,
    keys.NOUSE_TYPE,
    keys.VGPU_MODE,
)
"""Every pod annotation a user may set that numafit reads."""


# --- resources ------------------------------------------------------------------------------


def check_count(nums: int, value: object, what: str) -> None:
    if nums < 0:
        raise RequestError(f"{what} {shown(value)} is negative: give at least 0")
    if nums > keys.INT32_MAX:
        raise RequestError(f"{what} {shown(value)} overflows int32")


def check_memory(mem: int, memreq: int, value: object, what: str) -> None:
    """`mem` as given, `memreq` after `memoryFactor`."""
    if mem < 0:
        raise RequestError(f"{what} {shown(value)} is negative: give at least 1 (MiB)")
    if memreq > keys.INT32_MAX:
        raise RequestError(f"{what} {shown(value)} overflows int32")


def zero_memory(value: object, what: str, percentage_name: str) -> RequestError:
    """The refusal of a memory of 0 with no percentage beside it (HAMi would reserve the
    whole card)."""
    return RequestError(
        f"{what} {shown(value)} asks for 0 MiB, which HAMi reads as not given (the whole "
        f"card): give at least 1 (MiB), or a {percentage_name}, or neither"
    )


def check_percentage(percentage: int, value: object, what: str) -> None:
    if not MIN_PERCENTAGE <= percentage <= MAX_PERCENTAGE:
        raise RequestError(
            f"{what} {shown(value)} is out of range: give {MIN_PERCENTAGE} to {MAX_PERCENTAGE} "
            "(percent of the card's memory)"
        )


def check_cores(cores: int, value: object, what: str) -> None:
    if not 0 <= cores <= MAX_CORES:
        raise RequestError(
            f"{what} {shown(value)} is out of range: give 0 to {MAX_CORES} "
            "(percent of one GPU's cores)"
        )


# --- annotations ----------------------------------------------------------------------------


def check_annotations(annotations: Mapping[str, str | None]) -> None:
    """Raise PodAnnotationError, naming the first annotation of READ_ANNOTATIONS whose value
    breaks its rule (an absent or None value is not given)."""
    for key in READ_ANNOTATIONS:
        value = annotations.get(key)
        if value is not None:
            check_annotation(key, value)


def check_annotation(key: str, value: str) -> None:
    # Characters bound bytes from below (at most 4 each): most values skip the encoding.
    if len(value) * 4 > MAX_ANNOTATION_BYTES:
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_ANNOTATION_BYTES:
            raise PodAnnotationError(
                key,
                f"{key} is {size} bytes long: numafit reads at most {MAX_ANNOTATION_BYTES} bytes",
            )
    rule = _RULES.get(key)
    if rule is None:
        return
    try:
        why = rule(value)
    except AnnotationError as exc:
        raise PodAnnotationError(key, str(exc)) from None
    if why is not None:
        raise PodAnnotationError(key, f"{key} {why}")


def _numa_bind(value: str) -> str | None:
    if parse_go_bool(value.strip()) is not None:
        return None
    return (
        f"{shown(value)} is not a boolean: use true or false (Go's strconv.ParseBool also "
        "reads 1, t, T, TRUE, True and 0, f, F, FALSE, False)"
    )


def _alignment(value: str) -> str | None:
    parse_alignment(value)  # raises, naming the annotation
    return None


def _weights(value: str) -> str | None:
    parse_scoring_weights(value)  # raises, naming the annotation
    return None


_RULES: dict[str, Callable[[str], str | None]] = {
    keys.GPU_POLICY: check_gpu_policy,
    keys.NODE_POLICY: check_node_policy,
    keys.NUMA_ALIGNMENT: _alignment,
    keys.SCORING_WEIGHTS: _weights,
    keys.NUMA_BIND: _numa_bind,
}
"""Why a value is refused (None: it is not), for the annotations with a rule besides size."""
