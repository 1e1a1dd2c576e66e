"""`pytestmark = kubelet_tier()` at the top of every module here: the real tier's conditions
(tests/real/tier.py) plus what a real kubelet needs on this machine; where one is missing the
module is skipped at collection from this one place, so pytest folds the kubelet tier into one
line naming what is missing."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.real.controlplane import Assets
from tests.real.kubelet import containerd, host


def missing() -> str | None:
    """Why the kubelet tier cannot run here (one line), or None."""
    found = Assets.find()
    if isinstance(found, str):
        return found
    if not os.access(found.binary("kubelet"), os.X_OK):
        return f"real kubelet tier: no kubelet in KUBEBUILDER_ASSETS={found.directory}"
    if os.geteuid() != 0:
        return "real kubelet tier: needs root (kubelet, containerd and the mounts under /sys)"
    for tool in ("unshare", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"real kubelet tier: {tool} not on PATH (util-linux)"
    return containerd.missing() or host.kubelet_root_foreign()


def kubelet_tier() -> pytest.MarkDecorator:
    why = missing()
    if why is not None:
        pytest.skip(why, allow_module_level=True)
    return pytest.mark.real
