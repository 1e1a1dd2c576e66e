"""`numafit plan`: the pure refit decision on a case file, offline.

A case holds a Node (with HAMi's register annotation), the Pods bound to it, optional
ResourceQuotas and scheduler config, and one refit request. The answer is the refit reply
(docs/reference/messages.md) plus the annotation values that would be patched and the node's
usage afterwards, counted phase-aware exactly as the accounting service counts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from shared import messages
from shared.core import codec, keys, overcommit
from shared.core.accounting import TrackedPod, node_snapshot, track_pod
from shared.core.config import CoreConfig, parse_config
from shared.core.errors import CoreError
from shared.core.fit import PICKED
from shared.core.nodes import without_pod
from shared.core.pods import Alignment, pod_from_object
from shared.core.quota import QuotaLedger, limits_from_quotas
from shared.core.refit import Code, RefitDecision, RefitInput, decide_refit

if TYPE_CHECKING:
    from shared.core.model import DeviceInfo, NodeSnapshot


class CaseError(ValueError):
    """The case itself is malformed (exit status 2)."""


def refit_request(body: Any) -> RefitInput:
    """The case's `request`, decoded exactly as svc_refit decodes one from NATS."""
    try:
        return msgspec.convert(body, messages.RefitRequest).to_core()
    except (msgspec.ValidationError, messages.MessageError) as exc:
        raise CaseError(f"refit request: {exc}") from exc


_CASE_KEYS = {"node", "pods", "resourceQuotas", "config", "request"}


@dataclass(frozen=True, slots=True)
class Case:
    node_name: str
    node: NodeSnapshot | None
    """None when the node carries no register annotation (unregistered)."""
    pods: Mapping[str, TrackedPod]
    quota: QuotaLedger
    config: CoreConfig
    request: RefitInput
    warnings: tuple[str, ...]


def load_case(obj: Any) -> Case:
    """Validate a parsed case; raise CaseError naming the first problem."""
    _check_case_keys(obj)
    try:
        config = parse_config(obj.get("config"))
        name, devices, cordon = _load_node(obj["node"])
        tracked, warnings = _load_pods(obj.get("pods", []))
        ledger = _load_quotas(obj.get("resourceQuotas", []), config, tracked)
        request = refit_request(obj["request"])
    except CaseError:
        raise
    except CoreError as exc:
        raise CaseError(str(exc)) from exc

    snapshot = None
    if devices is not None:
        snapshot = node_snapshot(name, devices, codec.parse_uuid_list(cordon), tracked.values())
    return Case(name, snapshot, tracked, ledger, config, request, tuple(warnings))


def _check_case_keys(obj: Any) -> None:
    if not isinstance(obj, Mapping):
        raise CaseError("case must be a JSON object")
    unknown = sorted(set(obj) - _CASE_KEYS)
    if unknown:
        raise CaseError(f"unknown case key(s) {', '.join(unknown)}; known: {sorted(_CASE_KEYS)}")
    for required in ("node", "request"):
        if required not in obj:
            raise CaseError(f"case has no {required!r}")


def _load_node(node_obj: Any) -> tuple[str, tuple[DeviceInfo, ...] | None, str | None]:
    """The node's name, its registered devices (None when unregistered) and its cordon list."""
    if not isinstance(node_obj, Mapping) or not isinstance(node_obj.get("metadata"), Mapping):
        raise CaseError("node must be a Kubernetes Node object with metadata")
    meta = node_obj["metadata"]
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise CaseError("node has no metadata.name")
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        raise CaseError("node metadata.annotations must be an object")
    register = annotations.get(keys.NODE_REGISTER)
    cordon = annotations.get(keys.DEVICE_CORDON)
    if register is not None and not isinstance(register, str):
        raise CaseError(f"node annotation {keys.NODE_REGISTER} must be a string")
    if cordon is not None and not isinstance(cordon, str):
        raise CaseError(f"node annotation {keys.DEVICE_CORDON} must be a string")
    if register is None:
        return name, None, cordon
    try:
        return name, codec.parse_register(register), cordon
    except CoreError as exc:
        raise CaseError(f"node annotation {keys.NODE_REGISTER}: {exc}") from exc


def _load_pods(pod_objs: Any) -> tuple[dict[str, TrackedPod], list[str]]:
    """The tracked pods by uid and a warning for each whose annotations do not decode."""
    if not isinstance(pod_objs, list):
        raise CaseError("pods must be a list of Pod objects")
    tracked: dict[str, TrackedPod] = {}
    warnings: list[str] = []
    seen: set[str] = set()
    for position, pod_obj in enumerate(pod_objs):
        try:
            pod = pod_from_object(pod_obj)
        except CoreError as exc:
            raise CaseError(f"pods[{position}]: {exc}") from exc
        if pod.uid in seen:
            raise CaseError(f"pods[{position}]: uid {pod.uid} appears twice")
        seen.add(pod.uid)
        entry = track_pod(pod)
        if entry is None:
            continue
        tracked[pod.uid] = entry
        if entry.decode_error is not None:
            warnings.append(f"pod {pod.key}: {entry.decode_error} (not counted)")
    return tracked, warnings


def _load_quotas(
    quota_objs: Any, config: CoreConfig, tracked: Mapping[str, TrackedPod]
) -> QuotaLedger:
    """The namespaces' quota ledger, charged with every tracked pod."""
    if not isinstance(quota_objs, list):
        raise CaseError("resourceQuotas must be a list of ResourceQuota objects")
    ledger = QuotaLedger(limits_from_quotas(quota_objs, config))
    for entry in tracked.values():
        ledger.add(entry.pod.namespace, entry.usage)
    return ledger


@dataclass(frozen=True, slots=True)
class PlanResult:
    case: Case
    decision: RefitDecision
    node_after: NodeSnapshot | None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = msgspec.to_builtins(messages.RefitReply.from_decision(self.decision))
        if self.decision.annotations is not None:
            body["annotations"] = dict(self.decision.annotations)
        body["nodeUsage"] = self.node_after.usage_table() if self.node_after else {}
        if self.decision.event is not None:
            event = self.decision.event
            body["event"] = {"type": event.type, "reason": event.reason, "message": event.message}
        if self.case.warnings:
            body["warnings"] = list(self.case.warnings)
        return body


def run_plan(case: Case) -> PlanResult:
    decision = decide_refit(
        case.request, pods=case.pods, node=case.node, quota=case.quota, config=case.config
    )
    after = case.node
    if after is not None and decision.code is Code.MOVED and decision.stored_usage is not None:
        after = without_pod(after, case.pods[case.request.pod_uid].usage)
        after.add_pod_usage(decision.stored_usage)
    return PlanResult(case, decision, after)


def explain(result: PlanResult) -> str:
    """The decision for a person: what was asked, each device's verdict, what moved and why."""
    lines = _request_lines(result.case.request, result.decision)
    lines.append("")
    lines += _device_lines(result.case, result.decision)
    lines += _result_lines(result)
    lines += _annotation_lines(result.case, result.decision)
    lines += _usage_after_lines(result.node_after)
    for warning in result.case.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


def _request_lines(req: RefitInput, decision: RefitDecision) -> list[str]:
    lines = [
        f"Refit request: container {req.container_index}"
        + (f" ({req.container_name})" if req.container_name else "")
        + f" of pod {req.pod_namespace}/{req.pod_name} on node {req.node_name},"
        f" mode {req.mode.value}, budget {req.timeout_ms} ms",
        f"  kubelet allows: {', '.join(req.allowed_device_uuids) or '(nothing)'}",
    ]
    if decision.previous_devices:
        devs = ", ".join(
            f"{d.uuid} ({d.usedmem} MiB, {d.usedcores}% cores)" for d in decision.previous_devices
        )
        lines.append(f"  scheduler reserved: {devs}")
    return lines


def _device_lines(case: Case, decision: RefitDecision) -> list[str]:
    """Each device of the node with the usage the fit saw and its verdict."""
    if case.node is None or decision.preloaded is None:
        return []
    verdicts = {v.uuid: v.outcome for v in decision.fit.verdicts} if decision.fit else {}
    kept = {d.info.id for d in decision.preloaded.devices}
    lines = ["Devices (usage as the fit saw it: other pods + this pod's other phases):"]
    by_uuid = decision.preloaded.by_uuid()
    for device in case.node.devices:
        info = device.info
        head = f"  {info.id:<20} NUMA {info.numa:<3}"
        if info.id not in kept:
            lines.append(f"{head} not in kubelet's allowed set")
            continue
        seen = by_uuid[info.id]
        usage = (
            f"slots {seen.used}/{info.count}, mem {seen.usedmem}/{info.devmem} MiB, "
            f"cores {seen.usedcores}/{info.devcore}"
        )
        outcome = verdicts.get(info.id, "not needed")
        verdict = "PICKED" if outcome == PICKED else f"refused: {outcome}"
        if outcome == "not needed":
            verdict = "not needed (enough devices picked before it)"
        lines.append(f"{head} {usage:<52} {verdict}")
    lines.append("")
    return lines


def _result_lines(result: PlanResult) -> list[str]:
    decision, req = result.decision, result.case.request
    outcome = "succeeded" if decision.succeeded else "refused"
    lines = [f"Result: {outcome}, code {decision.code.value}"]
    if decision.code is Code.MOVED:
        lines.append(
            f"  moved container {req.container_index} from "
            f"{', '.join(d.uuid for d in decision.previous_devices)} to "
            f"{', '.join(d.uuid for d in decision.container_devices)}: kubelet can only hand "
            "out the allowed GPUs, so the reservation follows them and accounting stays exact"
        )
    elif decision.code is Code.ALREADY_ALIGNED:
        lines.append("  every reserved GPU is already in kubelet's allowed set; nothing changes")
    else:
        lines.append(f"  why: {decision.failure_reason}")
        lines.extend(_after_refusal(result))
    return lines


def _annotation_lines(case: Case, decision: RefitDecision) -> list[str]:
    if not decision.annotations:
        return []
    lines = ["", "Annotations to patch:"]
    target = case.pods[case.request.pod_uid]
    old = {keys.TO_ALLOCATE: target.to_allocate, keys.ALLOCATED: target.allocated}
    for key, value in decision.annotations.items():
        lines.append(f"  {key}")
        lines.append(f"    before: {old[key]}")
        lines.append(f"    after:  {value}")
    return lines


def _usage_after_lines(node_after: NodeSnapshot | None) -> list[str]:
    if node_after is None:
        return []
    lines = ["", "Node usage after the decision (phase-aware, every pod):"]
    for device in node_after.devices:
        info = device.info
        lines.append(
            f"  {info.id:<20} NUMA {info.numa:<3} slots {device.used}/{info.count}, "
            f"mem {device.usedmem}/{info.devmem} MiB, cores {device.usedcores}/{info.devcore}"
        )
    return lines


def _after_refusal(result: PlanResult) -> list[str]:
    """What a refusal leads to in the request's mode. In best-effort mode kubelet keeps its own
    choice among the allowed GPUs (those it can align the container with) and accounting
    follows what runs, so each allowed GPU is judged as the container's new home."""
    decision, request = result.decision, result.case.request
    if request.mode is Alignment.STRICT:
        return [
            "  nothing is patched; strict mode: the container's admission fails (bind-phase "
            "failed) and nothing runs on kubelet's choice"
        ]
    lines = [
        "  nothing is patched; best-effort mode: kubelet keeps its own choice among the allowed "
        "GPUs and accounting follows what runs"
    ]
    if decision.preloaded is None or not decision.previous_devices:
        return lines
    amount = decision.previous_devices[0]
    allowed = set(request.allowed_device_uuids)
    for device in decision.preloaded.devices:
        info = device.info
        if info.id not in allowed or not info.matches_vendor(request.device_type):
            continue
        mem, cores = device.usedmem + amount.usedmem, device.usedcores + amount.usedcores
        over = (
            [overcommit.overcommitted(info.id, mem, info.devmem, cores, info.devcore)]
            if overcommit.is_overcommitted(mem, info.devmem, cores, info.devcore)
            else []
        )
        lines.append(f"    if kubelet picks {info.id}: {overcommit.fallback_result(True, over)}")
    return lines
