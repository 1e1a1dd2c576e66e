"""GPU over-commit: what is reserved on a GPU beyond what it has, and the words for it.

Accounting follows what runs. When a best-effort refit is refused or unanswered, kubelet keeps
its own choice (a *fallback*) and the container's reservation moves to kubelet's GPU even when
it does not fit there; a pod without `hami.io/numa-alignment` under a NUMA-restricting Topology
Manager does the same. Under such a policy kubelet only offers GPUs of the container's NUMA
node, so the container runs NUMA-aligned: the harm is the GPU's over-commit, not misalignment.

`numafit simulate`/`demo`'s report and `numafit plan --explain` say it with these functions, so
the wording is the same everywhere:
"aligned, but GPU-0 is over-committed by a best-effort fallback (110000/81920 MiB)".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

FALLBACK = "a best-effort fallback"
"""The cause: kubelet's choice kept after a best-effort refit was refused or unanswered."""
NOT_OPTED_IN = "kubelet's choice for a pod without hami.io/numa-alignment"
"""The cause: kubelet gave other GPUs than reserved to a pod that did not opt in to refits."""


def overcommitted_mib(usedmem: int, devmem: int) -> int:
    """Memory reserved above the GPU's memory (0 when it fits)."""
    return max(usedmem - devmem, 0)


def is_overcommitted(usedmem: int, devmem: int, usedcores: int = 0, devcore: int = 100) -> bool:
    """More memory or more core percent reserved than the GPU has."""
    return usedmem > devmem or usedcores > devcore


def amounts(usedmem: int, devmem: int, usedcores: int = 0, devcore: int = 100) -> str:
    """`110000/81920 MiB`, with the cores when they are over-committed too."""
    text = f"{usedmem}/{devmem} MiB"
    if usedcores > devcore:
        text += f", {usedcores}/{devcore} % cores"
    return text


def overcommitted(
    uuid: str,
    usedmem: int,
    devmem: int,
    usedcores: int = 0,
    devcore: int = 100,
    cause: str = FALLBACK,
) -> str:
    """`GPU-0 is over-committed by a best-effort fallback (110000/81920 MiB)`."""
    return f"{uuid} is over-committed by {cause} ({amounts(usedmem, devmem, usedcores, devcore)})"


def fallback_result(aligned: bool, overcommits: Sequence[str], numa: str = "") -> str:
    """How a container running on kubelet's choice ended: its alignment (`numa`, e.g. `GPU
    NUMA 1, CPU NUMA 0`, is shown when it is not aligned), then each over-committed GPU
    (`overcommitted()` texts), e.g. `aligned, but GPU-0 is over-committed by a best-effort
    fallback (110000/81920 MiB)` or `aligned, and no GPU is over-committed`."""
    head = "aligned" if aligned else "NOT aligned" + (f" ({numa})" if numa else "")
    if not overcommits:
        return f"{head}, and no GPU is over-committed"
    return f"{head}, {'but' if aligned else 'and'} {' and '.join(overcommits)}"
