"""From a Pod object to what the emulated kubelet admits, and back to the status it writes.

`container_asks` reads a Pod as kubelet's managers see it: containers in admission order (init
containers first), each with its device count, its kind (what a regular init container holds
is reusable by the containers after it), and its exclusive CPUs, which kubelet's static policy
gives only to a Guaranteed pod's containers with a whole CPU request (the scheduler predicts by
the same rule: shared/core/numa_prediction.py).

`rejected_status` is what kubelet writes when it rejects a pod (`rejectPod`): phase Failed,
kubelet's reason, and the message prefixed `Pod was rejected: ` (the Warning Event carries the
message without it); after an `UnexpectedAdmissionError` it also writes containerStatuses, each
app container terminated with `ContainerStatusUnknown` and exit code 137, as kubelet v1.28.7
was seen to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shared.core.numa_prediction import exclusive_cpus, pod_guaranteed
from shared.core.pods import pod_from_object
from shared.core.quantity import parse_quantity
from shared.testing.kubelet_emulator.emulator import ContainerAsk
from shared.testing.kubelet_emulator.errors import UnexpectedAdmissionError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from shared.testing.kubelet_emulator.errors import AdmissionError

__all__ = [
    "CONTAINER_STATUS_UNKNOWN",
    "REJECTED_PREFIX",
    "container_asks",
    "device_count",
    "rejected_status",
]

REJECTED_PREFIX = "Pod was rejected: "
CONTAINER_STATUS_UNKNOWN = "ContainerStatusUnknown"
UNKNOWN_MESSAGE = "The container could not be located when the pod was terminated"
UNKNOWN_EXIT_CODE = 137


def device_count(
    limits: Mapping[str, object], requests: Mapping[str, object], resource: str
) -> int:
    """A container's whole number of `resource` devices (its limit, else its request), 0 when
    absent or not a positive whole number."""
    raw = limits.get(resource, requests.get(resource))
    if raw is None:
        return 0
    try:
        value = parse_quantity(raw)
    except ValueError:
        return 0
    return int(value) if value.denominator == 1 and value > 0 else 0


def container_asks(pod: Mapping[str, Any], resource: str = "nvidia.com/gpu") -> list[ContainerAsk]:
    """The pod's containers as kubelet admits them (raises `ObjectError` for a malformed pod)."""
    info = pod_from_object(pod)
    guaranteed = pod_guaranteed([(c.limits, c.requests) for c in info.containers])
    return [
        ContainerAsk(
            c.name,
            device_count(c.limits, c.requests, resource),
            exclusive_cpus(c.limits, c.requests, guaranteed),
            resource,
            c.kind,
            dict(c.limits),
            dict(c.requests),
        )
        for c in info.containers
    ]


def rejected_status(pod: Mapping[str, Any], error: AdmissionError) -> dict[str, Any]:
    """The pod status kubelet writes when it rejects `pod` for `error`."""
    status: dict[str, Any] = {
        "phase": "Failed",
        "reason": error.reason,
        "message": REJECTED_PREFIX + error.message,
    }
    if isinstance(error, UnexpectedAdmissionError):
        spec = pod.get("spec") or {}
        status["containerStatuses"] = [
            {
                "name": container.get("name", ""),
                "image": container.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "lastState": {},
                "state": {
                    "terminated": {
                        "exitCode": UNKNOWN_EXIT_CODE,
                        "reason": CONTAINER_STATUS_UNKNOWN,
                        "message": UNKNOWN_MESSAGE,
                    }
                },
            }
            for container in spec.get("containers") or []
            if isinstance(container, dict)
        ]
    return status
