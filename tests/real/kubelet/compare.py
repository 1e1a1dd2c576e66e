"""One case's outcome in a form both kubelets can be held to: the real kubelet's run (its
containers' output, the plugin's counters, the pod's status) and `numafit simulate`'s run of the
same manifest on a node built like the real one (the same GPUs, the same exclusive CPUs per NUMA
node, the same Topology Manager policy, the scheduler's policies as the chart renders them).

What is compared, per pod: whether it runs or why kubelet refused it (reason, message, the
containers' status kubelet writes); per container, the GPUs it got (their NUMA node and count
where kubelet picks them itself, its choice being arbitrary), the NUMA node of its exclusive
CPUs (None: not pinned) and whether accounting's ledger names what runs; and the device
plugin's GetPreferredAllocation outcomes (`mode/result`: refit or not, and why), which also
count how often kubelet asked.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING, Any

import yaml

from shared.tools.simulate.report import simulate
from shared.tools.simulate.scenario import parse_scenario
from tests.real.kubelet import sysfs
from tests.real.kubelet.cases import NODE
from tests.real.kubelet.deviceplugin import GPU_NUMA, GPUS
from tests.real.kubelet.kubelet import RESERVED_CPUS
from tests.real.kubelet.observe import REFITS

if TYPE_CHECKING:
    from shared.tools.simulate.cluster import SimCluster
    from tests.real.kubelet.cases import Case
    from tests.real.kubelet.observe import PodSeen

Outcome = dict[str, Any]

SCHEDULER_FLAGS = {
    "--gpu-scheduler-policy": "gpuSchedulerPolicy",
    "--node-scheduler-policy": "nodeSchedulerPolicy",
    "--default-gpu-num": "defaultGPUNum",
}
"""svc_scheduler's flags that shape a placement, and `numafit simulate`'s config keys for them."""


def scheduler_config(args: list[str]) -> dict[str, Any]:
    """The simulate config equal to svc_scheduler's rendered command line."""
    config: dict[str, Any] = {}
    for arg in args:
        flag, _, value = arg.partition("=")
        if flag in SCHEDULER_FLAGS:
            key = SCHEDULER_FLAGS[flag]
            config[key] = int(value) if key == "defaultGPUNum" else value
    return config


def exclusive_cpus() -> dict[int, int]:
    """Exclusive CPUs per NUMA node of the real kubelet: its CPUs less the reserved ones."""
    return {
        numa: sum(1 for cpu in cpus if cpu not in RESERVED_CPUS)
        for numa, cpus in sysfs.CPUS_BY_NUMA.items()
    }


def cpu_numa(allowed: str | None) -> int | None:
    """The NUMA node a container's `Cpus_allowed_list` is pinned to; None when it may run on
    CPUs of both (not pinned) or never ran."""
    if allowed is None:
        return None
    cpus: set[int] = set()
    for part in allowed.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    nodes = {n for n, members in sysfs.CPUS_BY_NUMA.items() if cpus & set(members)}
    return nodes.pop() if len(nodes) == 1 else None


def _gpus(case: Case, name: str, gpus: list[str]) -> Any:
    if name in case.kubelet_picks:
        return {"numa": sorted(GPU_NUMA[g] for g in gpus), "distinct": len(set(gpus))}
    return sorted(gpus)


def _statuses(statuses: list[dict[str, Any]]) -> list[tuple[str, str, int | None]]:
    """(container, terminated reason, exit code) of every container kubelet reports
    terminated: what kubelet writes for containers of a refused pod."""
    found = []
    for status in statuses:
        terminated = (status.get("state") or {}).get("terminated")
        if terminated:
            found.append((status["name"], terminated.get("reason", ""), terminated.get("exitCode")))
    return sorted(found)


def refusals(message: str) -> list[str]:
    """The reason names (`CardInsufficientMemory: ...`, `KubeletRejectsInitContainerResources:
    ...`) a scheduling message gives: kube-scheduler and the emulated cluster word the rest of
    it differently (`0/5 nodes are available: 1 <reason>, 4 node(s) didn't match ...` and
    `0/1 nodes are available: <node>: <reason>`)."""
    return sorted(set(re.findall(r"\b([A-Z][a-z]+(?:[A-Z][a-z]+)+):", message)))


def _refused(phase: str, outcome: Outcome, message: str, statuses: list[dict[str, Any]]) -> None:
    if phase == "Failed":
        outcome["message"] = message
        outcome["terminated"] = _statuses(statuses)
    elif phase == "Pending":
        outcome["refusals"] = refusals(message)


def real_outcome(seen: PodSeen) -> Outcome:
    outcome: Outcome = {
        "phase": seen.phase,
        "reason": seen.reason,
        "containers": {
            c.name: {
                "gpus": _gpus(seen.case, c.name, list(c.gpus)),
                "cpuNuma": cpu_numa(c.cpus),
                "ledgerNamesWhatRuns": c.ledger_gpus == c.gpus,
            }
            for c in seen.containers
        },
        "plugin": dict(seen.refits),
    }
    _refused(seen.phase, outcome, seen.message, seen.container_statuses)
    return outcome


def _plugin_outcomes(metrics: dict[str, float]) -> dict[str, int]:
    """`mode/result` counts from a simulate report's metrics (`name{k="v",...}` keys)."""
    found: Counter[str] = Counter()
    for key, value in metrics.items():
        if key.startswith(REFITS + "{") and value:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', key))
            found[f"{labels['mode']}/{labels['result']}"] = int(value)
    return dict(found)


def scenario_text(case: Case, config: dict[str, Any], kubelet_version: str) -> str:
    node = {
        "name": NODE,
        "kubeletVersion": kubelet_version,
        "topologyPolicy": case.policy,
        "cpus": exclusive_cpus(),
        # The GPUs the real node lost to XIDs are left out: `numafit simulate` waits at start
        # for every replica to be healthy, so a node with an unhealthy GPU never starts; to
        # kubelet's admission and numafit's fit a GPU without healthy replicas is one that is
        # not there.
        "gpus": [gpu for gpu in GPUS if gpu["uuid"] not in case.unhealthy],
    }
    return yaml.safe_dump({"nodes": [node], "config": config, "pods": [case.manifest()]})


async def emulated_outcome(case: Case, config: dict[str, Any], kubelet_version: str) -> Outcome:
    """The case through `numafit simulate` (the kubelet emulator, playing `kubelet_version`,
    driving the real device plugin), in the form of `real_outcome`."""
    scenario = parse_scenario(
        scenario_text(case, config, kubelet_version), source=f"case {case.name}"
    )
    status: dict[str, Any] = {}

    async def read_status(cluster: SimCluster) -> None:
        # Before the emulated cluster stops: the pod's status as the emulated kubelet wrote
        # it (the report leaves the message and the containers' statuses out).
        pod = await cluster.api.get_pod(case.namespace, case.name)
        status.update(pod.get("status") or {})

    report = await simulate(scenario, keep=read_status)
    (pod,) = report["pods"]
    outcome: Outcome = {
        "phase": pod["phase"],
        "reason": pod["reason"],
        "containers": {
            c["name"]: {
                "gpus": _gpus(case, c["name"], list(c["gpus"])),
                # A refused pod runs nothing (the real one's containers never print).
                "cpuNuma": c["cpuNuma"] if pod["phase"] == "Running" else None,
                "ledgerNamesWhatRuns": sorted(c["ledgerGpus"]) == sorted(c["gpus"]),
            }
            for c in pod["containers"]
        },
        "plugin": _plugin_outcomes(report["metrics"]),
    }
    statuses = [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]
    # A refused pod's message is the status kubelet writes; an unscheduled one's is the
    # driver's account of the extender's answer (in the report's table data: the JSON
    # contract has no message).
    message = status.get("message") or report["_table"]["messages"][f"{case.namespace}/{case.name}"]
    _refused(pod["phase"], outcome, message, statuses)
    return outcome
