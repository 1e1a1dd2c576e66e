"""The pods the kubelet tier runs, one case each, the same manifests on the real kubelet and on
numafit's kubelet emulator (`numafit simulate`).

Every container prints what it was given (`NVIDIA_VISIBLE_DEVICES`, the device plugin's
answer to Allocate, and its `Cpus_allowed_list`, the CPU manager's pinning) and app containers
then wait for TERM: the container's own output is what runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.real.kubelet.images import WORKLOAD_IMAGE
from tests.real.kubelet.kubelet import BEST_EFFORT, SINGLE_NUMA_NODE

NODE = "kubelet-tier-gpu"
"""The real kubelet's node name (and the emulated node's, so the manifests are the same)."""
NAMESPACE = "kubelet-tier"
WEBHOOK_SKIPPED = "kube-system"
"""A namespace numafit's admission webhook never sees (the chart's default
`webhooks.excludeNamespaces`)."""
SCHEDULER_NAME = "numafit-scheduler"
"""numafit's scheduler name (the chart's and `numafit simulate`'s): pods name it themselves,
so that they reach numafit's scheduler also where the webhook does not route them."""

REPORT = 'echo "gpus=$NVIDIA_VISIBLE_DEVICES"; grep Cpus_allowed_list /proc/self/status'
WAIT_FOR_TERM = "trap 'exit 0' TERM; sleep 2147483647 & wait"


@dataclass(frozen=True, slots=True)
class Box:
    """One container: its GPU ask, and whether it is Guaranteed with one exclusive CPU."""

    name: str
    gpus: int = 1
    memory: int | None = 20000
    cores: int | None = 30
    exclusive_cpu: bool = True
    init: bool = False

    def manifest(self) -> dict[str, Any]:
        limits: dict[str, Any] = {"memory": "64Mi", "nvidia.com/gpu": str(self.gpus)}
        if self.memory is not None:
            limits["nvidia.com/gpumem"] = str(self.memory)
        if self.cores is not None:
            limits["nvidia.com/gpucores"] = str(self.cores)
        resources: dict[str, Any] = {"limits": limits}
        if self.exclusive_cpu:  # Guaranteed: requests default to the limits
            limits["cpu"] = "1"
        else:  # Burstable: a memory request below its limit, no CPU
            resources["requests"] = {"memory": "32Mi"}
        script = REPORT if self.init else f"{REPORT}; {WAIT_FOR_TERM}"
        return {
            "name": self.name,
            "image": WORKLOAD_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", script],
            "resources": resources,
        }


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    policy: str
    boxes: tuple[Box, ...]
    alignment: str | None = None
    unhealthy: tuple[str, ...] = ()
    """GPUs that report an XID before the pod is created (health lost for the plugin's
    lifetime)."""
    kubelet_picks: frozenset[str] = field(default_factory=frozenset)
    """Containers whose GPU kubelet chooses itself (no preference from the plugin): its
    choice is arbitrary, so only the NUMA node and the number of distinct GPUs are compared."""
    namespace: str = NAMESPACE
    annotations: tuple[tuple[str, str], ...] = ()
    """More pod annotations than the opt-in (e.g. `nvidia.com/use-gpuuuid`)."""
    unschedulable: bool = False
    """The run ends when kube-scheduler reports the pod unschedulable, instead of when it runs
    or kubelet refuses it (a wait condition: what the refusal says is compared)."""

    @property
    def init_boxes(self) -> tuple[Box, ...]:
        return tuple(b for b in self.boxes if b.init)

    @property
    def app_boxes(self) -> tuple[Box, ...]:
        return tuple(b for b in self.boxes if not b.init)

    def manifest(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "schedulerName": SCHEDULER_NAME,
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "hostNetwork": True,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 5,
            "restartPolicy": "Never",
            "containers": [b.manifest() for b in self.app_boxes],
        }
        if self.init_boxes:
            spec["initContainers"] = [b.manifest() for b in self.init_boxes]
        annotations = dict(self.annotations)
        if self.alignment is not None:
            annotations["hami.io/numa-alignment"] = self.alignment
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "annotations": annotations,
            },
            "spec": spec,
        }


MAIN = Box("main")
BIG = Box("main", memory=50000)
"""Over 40960 MiB: fits NUMA 0's GPUs only."""

BEST_EFFORT_REFIT = Case("best-effort-refit", SINGLE_NUMA_NODE, (MAIN,), "best-effort")
STRICT_REFIT = Case("strict-refit", SINGLE_NUMA_NODE, (MAIN,), "strict")
STRICT_UNALIGNABLE = Case("strict-unalignable", SINGLE_NUMA_NODE, (BIG,), "strict")
BEST_EFFORT_NO_FIT = Case(
    "best-effort-no-fit",
    SINGLE_NUMA_NODE,
    (BIG,),
    "best-effort",
    kubelet_picks=frozenset({"main"}),
)
"""The refit finds no NUMA 1 GPU with 50000 MiB, and kubelet offers nothing else: a fallback
onto one of them would over-commit it (issue 21 item 4)."""
PINNED_ELSEWHERE = Case(
    "best-effort-pinned-elsewhere",
    SINGLE_NUMA_NODE,
    (MAIN,),
    "best-effort",
    annotations=(("nvidia.com/use-gpuuuid", "GPU-3"),),
)
"""Limited to GPU-3 (NUMA 0) by `nvidia.com/use-gpuuuid` while kubelet offers NUMA 1 only:
best-effort gives up NUMA alignment, never the pod's own constraints (issue 21 item 4)."""
NOT_OPTED_IN = Case("not-opted-in", SINGLE_NUMA_NODE, (MAIN,), kubelet_picks=frozenset({"main"}))
BURSTABLE = Case("burstable", SINGLE_NUMA_NODE, (Box("main", exclusive_cpu=False),), "best-effort")
INIT_CONTAINERS = Case(
    "init-containers",
    SINGLE_NUMA_NODE,
    (Box("prep", memory=None, cores=None, init=True), MAIN),
    "strict",
    # kubelet 1.28 rejects an init container asking for gpumem or gpucores
    # (`OutOfnvidia.com/gpucores`, issue 21 item 5), and numafit's webhook adds
    # `nvidia.com/gpucores: 100` to a container asking for a whole GPU: only where the
    # webhook does not run can a GPU init container run on this kubelet.
    namespace=WEBHOOK_SKIPPED,
)
INIT_THROUGH_WEBHOOK = Case(
    "init-through-webhook",
    SINGLE_NUMA_NODE,
    (Box("prep", memory=None, cores=None, init=True), MAIN),
    "strict",
    unschedulable=True,
)
"""The same pod where numafit's webhook runs: it gives the init container
`nvidia.com/gpucores: 100`, which kubelet v1.28.7 would reject after the device plugin ran, so
numafit's scheduler refuses the node for it (issue 21 item 5)."""
TWO_GPUS_NOT_OPTED_IN = Case(
    "two-gpus-not-opted-in",
    SINGLE_NUMA_NODE,
    (Box("main", gpus=2, memory=10000),),
    kubelet_picks=frozenset({"main"}),
)
BEST_EFFORT_POLICY_REFIT = Case("policy-best-effort-refit", BEST_EFFORT, (MAIN,), "best-effort")
NUMA1_LOST = ("GPU-4", "GPU-5", "GPU-6", "GPU-7")
NO_NUMA_FITS_STRICT_POLICY = Case(
    "no-numa-fits-single-numa-node",
    SINGLE_NUMA_NODE,
    (MAIN,),
    "best-effort",
    unhealthy=NUMA1_LOST,
)
NO_NUMA_FITS_BEST_EFFORT_POLICY = Case(
    "no-numa-fits-best-effort", BEST_EFFORT, (MAIN,), "best-effort", unhealthy=NUMA1_LOST
)

COMPARED = (
    BEST_EFFORT_REFIT,
    STRICT_REFIT,
    STRICT_UNALIGNABLE,
    BEST_EFFORT_NO_FIT,
    PINNED_ELSEWHERE,
    NOT_OPTED_IN,
    BURSTABLE,
    INIT_CONTAINERS,
    INIT_THROUGH_WEBHOOK,
    TWO_GPUS_NOT_OPTED_IN,
    BEST_EFFORT_POLICY_REFIT,
    NO_NUMA_FITS_BEST_EFFORT_POLICY,
    NO_NUMA_FITS_STRICT_POLICY,
)
"""The cases run on both kubelets, grouped by policy (kubelet restarts when it changes)."""
