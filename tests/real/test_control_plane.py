"""The real tier's own fixture: a control plane that serves, authenticates as documented, and
leaves no process behind, a failing block included."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from tests.real.controlplane import Assets, ControlPlane
from tests.real.tier import real_tier
from tests.real.waiting import poll

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = real_tier()


def test_admin_and_controllers_serve(control_plane: ControlPlane) -> None:
    namespaces = control_plane.kubectl_json("get", "namespaces")
    names = {n["metadata"]["name"] for n in namespaces["items"]}
    assert {"default", "kube-system", "kube-node-lease"} <= names
    # kube-controller-manager's service-account controller made the accounts pods need.
    control_plane.kubectl("create", "namespace", "fixture-check")
    poll(
        lambda: (
            control_plane.kubectl(
                "get", "serviceaccount", "default", "-n", "fixture-check", check=False
            ).returncode
            == 0
        ),
        within=30,
        what="default ServiceAccount in a new namespace",
    )


def test_identities(control_plane: ControlPlane) -> None:
    control_plane.kubectl("create", "serviceaccount", "probe", "-n", "default")
    as_account = control_plane.service_account_kubeconfig("default", "probe")
    whoami = control_plane.kubectl("auth", "whoami", "-o", "json", kubeconfig=as_account)
    assert '"username": "system:serviceaccount:default:probe"' in whoami.stdout
    # RBAC: a fresh account may not list pods.
    denied = control_plane.kubectl("get", "pods", kubeconfig=as_account, check=False)
    assert denied.returncode != 0 and "Forbidden" in denied.stderr
    as_node = control_plane.user_kubeconfig("node-x", "system:node:node-x", ["system:nodes"])
    whoami = control_plane.kubectl("auth", "whoami", "-o", "json", kubeconfig=as_node)
    assert '"system:nodes"' in whoami.stdout
    # Denials are in the audit log, by user.
    audited = control_plane.audit_events("system:serviceaccount:default:probe")
    assert any(e["responseStatus"]["code"] == 403 for e in audited)


def test_a_failing_block_leaves_no_process(real_assets: Assets, tmp_path: Path) -> None:
    pids: list[int] = []

    def failing_test() -> None:
        with ControlPlane.started(real_assets, tmp_path) as plane:
            pids.extend(child.pid for child in plane.processes.children)
            raise RuntimeError("the test failed")

    with pytest.raises(RuntimeError, match="the test failed"):
        failing_test()
    assert len(pids) == 3  # etcd, kube-apiserver, kube-controller-manager

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    assert all(gone(pid) for pid in pids)
