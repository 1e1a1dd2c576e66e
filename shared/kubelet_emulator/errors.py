"""Why the kubelet emulator refuses a registration or a container.

The admission errors carry kubelet's own reasons and messages, because the
simulator reports them as pod status and tests compare them with what a real
kubelet would say::

    AdmissionError                 a container was not admitted (pod Failed)
     ├── TopologyAffinityError     no NUMA node satisfies the Topology Manager policy
     └── UnexpectedAdmissionError  anything else: plugin missing, RPC error, no devices
    RegistrationError              a Register call kubelet refuses (bad version or name)
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AdmissionError",
    "RegistrationError",
    "TopologyAffinityError",
    "UnexpectedAdmissionError",
]


class AdmissionError(Exception):
    """A container kubelet would not admit; ``reason`` is the pod status reason."""

    reason: ClassVar[str] = "AdmissionError"

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


class RegistrationError(Exception):
    """A device plugin's Register request that kubelet refuses."""
