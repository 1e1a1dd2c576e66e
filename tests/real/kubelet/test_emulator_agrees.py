"""numafit's kubelet emulator against the real kubelet: the same pods, the same node, the same
outcome (tests/real/kubelet/compare.py says what is compared), so the emulator every other
test relies on cannot drift from kubelet v1.28.7 again (issue 21 item 3).

Each case runs once on the real kubelet (its run is shared with the behaviour tests) and once
through `numafit simulate`, whose kubelet emulator drives the same device plugin code.
"""

from __future__ import annotations

import asyncio
from pprint import pformat
from typing import TYPE_CHECKING

import pytest

from tests.real.kubelet import cases
from tests.real.kubelet.compare import emulated_outcome, real_outcome, scheduler_config
from tests.real.kubelet.tier import kubelet_tier

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.real.kubelet.cases import Case
    from tests.real.kubelet.observe import PodSeen
    from tests.real.stack import NumafitStack

pytestmark = kubelet_tier()


@pytest.mark.parametrize("case", cases.COMPARED, ids=lambda c: c.name)
def test_the_emulator_agrees_with_the_real_kubelet(
    case: Case, run: Callable[[Case], PodSeen], numafit: NumafitStack
) -> None:
    seen = run(case)
    real = real_outcome(seen)
    _, args = numafit.rendered.service_args("svc-scheduler")
    emulated = asyncio.run(emulated_outcome(case, scheduler_config(args), seen.kubelet_version))
    assert emulated == real, f"emulator:\n{pformat(emulated)}\nreal kubelet:\n{pformat(real)}"
