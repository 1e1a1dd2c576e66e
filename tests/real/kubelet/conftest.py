"""Fixtures of the kubelet tier: one GPU node (tests/real/kubelet/node.py) for the whole
package, on the session's control plane and numafit stack (tests/real/conftest.py), torn down
when the package's last test is done, a failed one included.

Tests ask for the node with the Topology Manager policy they need (`single_numa_node`,
`best_effort`): kubelet is restarted only when the policy changes. Each case's run is kept for
the package (`runs`), so the emulator comparison and the behaviour tests read one run of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.real.kubelet import host
from tests.real.kubelet.cases import SCHEDULER_NAME
from tests.real.kubelet.kubelet import BEST_EFFORT, SINGLE_NUMA_NODE
from tests.real.kubelet.node import RealNode

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.real.controlplane import Assets, ControlPlane
    from tests.real.kubelet.cases import Case
    from tests.real.kubelet.observe import PodSeen
    from tests.real.stack import NumafitStack


@pytest.fixture(scope="package")
def real_node(
    real_assets: Assets,
    control_plane: ControlPlane,
    numafit: NumafitStack,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealNode]:
    # The cases name numafit's scheduler themselves (cases.SCHEDULER_NAME).
    assert numafit.scheduler_name == SCHEDULER_NAME, numafit.scheduler_name
    node = RealNode(real_assets, control_plane, numafit, tmp_path_factory.mktemp("kubelet-node"))
    try:
        node.start(SINGLE_NUMA_NODE)
        yield node
    finally:
        node.stop()
    # Reached when the tests are done, failed ones included: the teardown left nothing.
    assert not host.leftovers(node.containerd.socket), host.leftovers(node.containerd.socket)


@pytest.fixture
def single_numa_node(real_node: RealNode) -> RealNode:
    return real_node.use(SINGLE_NUMA_NODE)


@pytest.fixture
def best_effort(real_node: RealNode) -> RealNode:
    return real_node.use(BEST_EFFORT)


@pytest.fixture(scope="package")
def _runs() -> dict[str, PodSeen]:
    return {}


@pytest.fixture
def run(real_node: RealNode, _runs: dict[str, PodSeen]) -> Callable[[Case], PodSeen]:
    """The case's run on the real kubelet (kubelet switched to its policy), run once per
    package."""

    def seen(case: Case) -> PodSeen:
        if case.name not in _runs:
            _runs[case.name] = real_node.use(case.policy).run(case)
        return _runs[case.name]

    return seen
