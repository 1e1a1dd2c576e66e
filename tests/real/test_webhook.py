"""numafit's admission webhook behind the real Mutating/ValidatingWebhookConfiguration the
svc-scheduler chart renders: the API server calls it over HTTPS, trusting the chart's
`caBundle`, for pods outside the excluded namespaces."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tests.real import chart, cluster
from tests.real.tier import real_tier

if TYPE_CHECKING:
    from tests.real.controlplane import ControlPlane
    from tests.real.stack import NumafitStack

pytestmark = real_tier()
HOOK = "pods.numafit-scheduler.numafit.io"


def test_gpu_pods_are_routed_and_bad_ones_refused(
    control_plane: ControlPlane, numafit: NumafitStack
) -> None:
    plane = control_plane
    namespace = cluster.new_namespace(plane, "hook")
    group = cluster.unique("hook")  # no node: these pods are only admitted, never placed
    mutated_before = numafit.sample(
        "scheduler", 'numafit_scheduler_webhook_total{reason="allowed",result="mutated"}'
    )

    routed = cluster.create(plane, cluster.gpu_pod("routed", namespace, group, memory=1000))
    assert routed["spec"]["schedulerName"] == numafit.scheduler_name
    assert (
        numafit.sample(
            "scheduler", 'numafit_scheduler_webhook_total{reason="allowed",result="mutated"}'
        )
        == mutated_before + 1
    )
    # A pod asking for no GPU is left to the default scheduler.
    plain = cluster.gpu_pod("plain", namespace, group)
    del plain["spec"]["containers"][0]["resources"]
    assert cluster.create(plane, plain)["spec"]["schedulerName"] == "default-scheduler"

    refused = plane.kubectl(
        "create",
        "-f",
        "-",
        input=json.dumps(
            cluster.gpu_pod(
                "maybe",
                namespace,
                group,
                memory=1000,
                annotations={"hami.io/numa-alignment": "maybe"},
            )
        ),
        check=False,
    )
    assert refused.returncode != 0
    assert (
        f'admission webhook "{HOOK}" denied the request: hami.io/numa-alignment value '
        "'maybe' is invalid: use 'best-effort' or 'strict'"
    ) in refused.stderr

    # Scheduler-owned annotations cannot be set at creation (only accounting writes them).
    forged = cluster.gpu_pod(
        "forged", namespace, group, memory=1000, annotations={"hami.io/vgpu-node": "anywhere"}
    )
    refused = plane.kubectl("create", "-f", "-", input=json.dumps(forged), check=False)
    assert refused.returncode != 0 and f'admission webhook "{HOOK}" denied' in refused.stderr
    assert "hami.io/vgpu-node" in refused.stderr
    for name in ("maybe", "forged"):
        assert plane.kubectl("get", "pod", name, "-n", namespace, check=False).returncode != 0


def test_excluded_namespaces_are_not_sent(
    control_plane: ControlPlane, numafit: NumafitStack
) -> None:
    """The chart excludes its own namespace (and kube-system): a GPU pod there is not routed,
    and an annotation the webhook would refuse is let through."""
    name = cluster.unique("excluded")
    pod = cluster.gpu_pod(
        name,
        chart.NAMESPACE,
        "nowhere",
        memory=1000,
        annotations={"hami.io/numa-alignment": "maybe"},
    )
    created = cluster.create(control_plane, pod)
    assert created["spec"]["schedulerName"] == "default-scheduler"
    control_plane.kubectl("delete", "pod", name, "-n", chart.NAMESPACE, "--wait=false")
