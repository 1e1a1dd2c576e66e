"""Why the kubelet emulator refuses a registration or a container.

The admission errors carry kubelet's own reasons and messages, because the
simulator reports them as pod status and tests compare them with what a real
kubelet would say::

    AdmissionError                 a container was not admitted (pod Failed)
     ├── TopologyAffinityError     no NUMA node satisfies the Topology Manager policy
     ├── UnexpectedAdmissionError  anything else: plugin missing, RPC error, no devices
     └── OutOfResourceError        kubelet's resource predicate (`OutOf<resource>`), checked
                                   after the device plugin was called
    RegistrationError              a Register call kubelet refuses (bad version or name)

`message` is kubelet's own text, as its Warning Event carries it; the pod status kubelet writes
prefixes it with `Pod was rejected: ` (`shared.testing.kubelet_emulator.status`).
"""

from __future__ import annotations

__all__ = [
    "AdmissionError",
    "OutOfResourceError",
    "RegistrationError",
    "TopologyAffinityError",
    "UnexpectedAdmissionError",
]


class AdmissionError(Exception):
    """A container kubelet would not admit; ``reason`` is the pod status reason."""

    reason: str = "AdmissionError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TopologyAffinityError(AdmissionError):
    """The Topology Manager policy found no NUMA affinity for the container."""

    reason = "TopologyAffinityError"

    def __init__(self) -> None:
        super().__init__("Resources cannot be allocated with Topology locality")


class UnexpectedAdmissionError(AdmissionError):
    """Device allocation failed; ``cause`` is the underlying error text."""

    reason = "UnexpectedAdmissionError"

    def __init__(self, cause: str) -> None:
        super().__init__(f"Allocate failed due to {cause}, which is unexpected")
        self.cause = cause


class OutOfResourceError(AdmissionError):
    """kubelet's resource predicate refused the pod (`OutOf<resource>`): the node does not have
    what the pod asks for, e.g. an extended resource no plugin advertises (capacity 0)."""

    def __init__(self, resource: str, requested: int, used: int, capacity: int) -> None:
        super().__init__(
            f"Node didn't have enough resource: {resource}, requested: {requested}, "
            f"used: {used}, capacity: {capacity}"
        )
        self.reason = f"OutOf{resource}"
        self.resource = resource


class RegistrationError(Exception):
    """A device plugin's Register request that kubelet refuses."""
