"""What a pod's run on the real kubelet left to see, read from each party separately: the
containers' own output (what runs), kubelet's checkpoint, the pod's annotations and status,
events, accounting's ledger and usage, and the device plugin's counters.

Annotations are parsed here by hand (HAMi's encoding `UUID,Type,MiB,cores:` per device, `;`
after each container) so that a check never reads numafit's answer with numafit's own codec.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.real.kubelet import host

if TYPE_CHECKING:
    from pathlib import Path

    from tests.real.kubelet.cases import Case

ALLOCATED = "hami.io/vgpu-devices-allocated"
HAMI_PREFIX = "hami.io/"
REFITS = "numafit_deviceplugin_refits_total"
ALLOCATIONS = "numafit_deviceplugin_allocations_total"
REGISTRATIONS = "numafit_deviceplugin_registrations_total"

Device = tuple[str, int, int]
"""(uuid, MiB, cores) of one device of an annotation entry."""


def entries(value: str) -> list[tuple[Device, ...]]:
    """Per container position, its devices, from a `hami.io/vgpu-devices-*` value (the empty
    piece after the last `;` is not a container)."""
    pieces = value.split(";")
    if pieces and pieces[-1] == "":
        pieces = pieces[:-1]
    found = []
    for piece in pieces:
        devices = []
        for device in piece.split(":"):
            if device:
                uuid, _type, mem, cores = device.split(",")
                devices.append((uuid, int(mem), int(cores)))
        found.append(tuple(devices))
    return found


def container_output(namespace: str, pod: str, uid: str, container: str) -> dict[str, str]:
    """`key=value` and `Key:\tvalue` lines the container printed (CRI log files of kubelet:
    `<time> <stream> <tag> <line>`); empty while it has not written them."""
    path = host.POD_LOGS / f"{namespace}_{pod}_{uid}" / container / "0.log"
    try:
        text = path.read_text()
    except OSError:
        return {}
    found: dict[str, str] = {}
    for raw in text.splitlines():
        parts = raw.split(" ", 3)
        if len(parts) < 4:
            continue
        line = parts[3]
        match = re.match(r"^(gpus)=(.*)$|^(Cpus_allowed_list):\s*(.*)$", line)
        if match is None:
            continue
        key = match.group(1) or match.group(3)
        found[key] = match.group(2) if match.group(1) else match.group(4)
    return found


def checkpoint_devices(uid: str, checkpoint: Path | None = None) -> dict[str, tuple[str, ...]]:
    """Replica IDs kubelet's device manager holds for each container of pod `uid`."""
    path = checkpoint or host.DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint"
    try:
        data = json.loads(path.read_text())["Data"]
    except (OSError, ValueError, KeyError):
        return {}
    found: dict[str, tuple[str, ...]] = {}
    for entry in data.get("PodDeviceEntries") or []:
        if entry["PodUID"] == uid:
            ids = [i for per_numa in entry["DeviceIDs"].values() for i in per_numa]
            found[entry["ContainerName"]] = tuple(sorted(ids))
    return found


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of metric `name` in a /metrics text, by its labels."""
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = re.match(rf"^{re.escape(name)}(\{{(.*)\}})? (\S+)$", line)
        if match is None:
            continue
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', match.group(2) or "")))
        found[labels] = float(match.group(3))
    return found


def refit_results(text: str) -> Counter[str]:
    """`mode/result` -> count of the plugin's GetPreferredAllocation outcomes."""
    counts: Counter[str] = Counter()
    for labels, value in samples(text, REFITS).items():
        named = dict(labels)
        if value:
            counts[f"{named['mode']}/{named['result']}"] = int(value)
    return counts


def allocations_ok(text: str) -> int:
    return int(samples(text, ALLOCATIONS).get((("result", "ok"),), 0))


@dataclass
class ContainerSeen:
    name: str
    init: bool
    gpus: tuple[str, ...]
    """The physical GPUs the container was given (its NVIDIA_VISIBLE_DEVICES), sorted."""
    cpus: str | None
    """Its Cpus_allowed_list (None: it never ran)."""
    replicas: tuple[str, ...]
    """kubelet's checkpoint: the replica IDs it allocated to the container."""
    allocated: tuple[Device, ...]
    """Its entry of `hami.io/vgpu-devices-allocated` on the API server."""
    ledger: tuple[Device, ...]
    """Its entry in accounting's ledger."""

    @property
    def allocated_gpus(self) -> tuple[str, ...]:
        return tuple(sorted(d[0] for d in self.allocated))

    @property
    def ledger_gpus(self) -> tuple[str, ...]:
        return tuple(sorted(d[0] for d in self.ledger))


@dataclass
class PodSeen:
    case: Case
    namespace: str
    uid: str
    phase: str
    reason: str
    message: str
    annotations: dict[str, str]
    container_statuses: list[dict[str, Any]]
    events: list[tuple[str, str, str]]
    """(type, reason, message) of every event about the pod."""
    containers: list[ContainerSeen]
    reserved_memory: dict[str, float]
    """MiB accounting holds per GPU of the node while the pod runs (every pod counted)."""
    refits: Counter[str] = field(default_factory=Counter)
    """The device plugin's GetPreferredAllocation outcomes for this pod (`mode/result`)."""
    allocations: int = 0
    """Allocate calls the plugin answered ok for this pod."""
    ledger_released: bool | None = None
    kubelet_version: str = ""
    """What the node reports (`status.nodeInfo.kubeletVersion`)."""
    spec: dict[str, Any] = field(default_factory=dict)
    """The pod's spec as the API server holds it (after the admission webhook)."""

    def event_reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]

    def events_named(self, reason: str) -> list[str]:
        return [message for _, r, message in self.events if r == reason]
